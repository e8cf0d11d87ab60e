"""Where a job runs on a cluster: which launcher started this process and what it asks of us."""
