"""The lab lane (scripts/cluster-lab.sh): real sshd, munged, slurmctld and slurmd on
hosts that are network namespaces of this machine. Collected only when the lane runs
(``TESTBED_LAB=1``), after it has installed those daemons: the main suite neither
installs them nor waits for them."""

from __future__ import annotations

import os

LAB_ENV = "TESTBED_LAB"

collect_ignore_glob = [] if os.environ.get(LAB_ENV) == "1" else ["test_*.py"]
