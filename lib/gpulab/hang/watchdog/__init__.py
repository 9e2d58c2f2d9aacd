"""The watchdog: a command run and watched by its progress (watch, launch), a stall's evidence taken while it
is stuck (evidence, keepstall), the live status (status), and whether a stall is a usual pause (stalls)."""
