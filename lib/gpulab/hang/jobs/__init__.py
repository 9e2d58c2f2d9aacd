"""A job of many processes, one verdict: each process read from its folder (jobread), the ranks' collectives
compared per group (job and its parts), the notebook's view (jobview), several nodes merged (merge)."""
