"""A hand-in's logs as evidence, never the verdict: which files are a run's stdout and stderr and
which run counts (runs), and what they say (logfile for the .log, errfile for the .err, logtext
what both share). Reads bytes only: no torch, no engine."""
