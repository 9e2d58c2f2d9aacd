"""Open a page as a reader does: headless Chromium (Debian's package), the network cut off by a dead proxy,
every request recorded in Chromium's NetLog. Returns the DOM after scripts ran and the requests the page made."""
from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", "--proxy-server=127.0.0.1:9",
         "--virtual-time-budget=3000"]


def page_requests(netlog: Path) -> list[str]:
    """URLs the page itself asked for (Chromium's own background requests have no origin: left out)."""
    try:
        events = json.loads(netlog.read_text()).get("events", [])
    except (OSError, ValueError):
        return ["(no readable netlog)"]
    return [e["params"]["url"] for e in events
            if "initiator" in e.get("params", {}) and e["params"]["initiator"] != "not an origin"]


def open_page(path: Path, work: Path, screenshot: Path | None = None) -> tuple[str, list[str]]:
    work.mkdir(parents=True, exist_ok=True)
    netlog = work / f"netlog-{path.stem}.json"
    args = [CHROMIUM, *FLAGS, f"--user-data-dir={work / 'profile'}", f"--log-net-log={netlog}"]
    if screenshot is not None:
        subprocess.run(args + [f"--screenshot={screenshot}", "--window-size=1400,2400", path.resolve().as_uri()],
                       capture_output=True, timeout=120)
    dom = subprocess.run(args + ["--dump-dom", path.resolve().as_uri()], capture_output=True, text=True,
                         timeout=120).stdout
    return dom, page_requests(netlog)
