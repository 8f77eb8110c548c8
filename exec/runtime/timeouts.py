"""How long the executor waits for what (seconds)."""

# Process start-up (imports, gloo connections) is not what --timeout is about: setup waits
# get at least this long.
SETUP_TIMEOUT_S = 120.0
# The default (control) group only carries barriers, clock ping-pongs and results, and every
# wait on it names its own bound; gloo's per-operation timeout must not cut a long run short.
# (Communication tasks run on channel groups created with --timeout.) A dead peer still
# surfaces at once: its connections close, and the launcher stops the other ranks.
CONTROL_TIMEOUT_S = 24 * 3600.0
