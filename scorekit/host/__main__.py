"""``python -m scorekit.host --fd N``: the model host process, started by ``scorekit.host.client.HostClient``."""

import signal
import sys

# Before torch loads (seconds): a terminal's Ctrl-C reaches the whole process group, and the front end, not the
# keyboard, decides when its host stops.
signal.signal(signal.SIGINT, signal.SIG_IGN)

from scorekit.host.process import main  # noqa: E402

sys.exit(main())
