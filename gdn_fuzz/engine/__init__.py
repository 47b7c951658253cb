"""The engine that runs campaigns: the budgeted campaign (campaign), crash isolation in worker processes
(isolation), the regression corpus (corpus), one process per GPU (multigpu), reproducers of corpus
entries (reproducer), reports of a run (report) and what this machine can run (doctor)."""
