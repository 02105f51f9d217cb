"""The machine a benchmark report names: CPU model (lscpu), CPU count, load average, date."""

from __future__ import annotations

import os
import platform
import subprocess
import time
from typing import Any


def machine() -> dict[str, Any]:
    model = platform.processor() or platform.machine()
    try:
        for line in subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout.splitlines():
            if line.startswith("Model name:"):
                model = line.split(":", 1)[1].strip()
    except (OSError, subprocess.SubprocessError):
        pass
    return {
        "cpu": model,
        "cpus": os.cpu_count(),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "date": time.strftime("%Y-%m-%d"),
    }
