"""The one entry point of every process a sweep starts (internal; `scaling sweep` starts them):

  python -m scaling.study.sweeps.child run RUN_DIR PARENT_PID LOCK_FD   one run, its lock inherited (sweep.execute)
  python -m scaling.study.sweeps.child pack PARENT_PID DIR:FD ...       runs trained in step as one program (sweep.execute_pack)
  python -m scaling.study.sweeps.child takeoff JOB PARENT_PID           a take-off lane's probes (takeoff.take_off)
  python -m scaling.study.sweeps.child pack-probe JOB PARENT_PID        packed against single steps (takeoff.pack_probe)
  python -m scaling.study.sweeps.child device-probe OUT.json            a GPU's numerics and speed (devices.check_gpu_pins)
"""

from __future__ import annotations

import sys


def main(argv: list[str]) -> int:
    kind, rest = (argv[0], argv[1:]) if argv else ("", [])
    if kind == "run" and len(rest) == 3:
        from scaling.study.sweeps import sweep

        return sweep.run_child(rest[0], int(rest[1]), int(rest[2]))
    if kind == "pack" and len(rest) >= 2:
        from scaling.study.sweeps import sweep

        return sweep.pack_child(int(rest[0]), rest[1:])
    if kind == "takeoff" and len(rest) == 2:
        from scaling.study.sweeps import takeoff

        return takeoff.takeoff_child(rest[0], int(rest[1]))
    if kind == "pack-probe" and len(rest) == 2:
        from scaling.study.sweeps import takeoff

        return takeoff.pack_probe_child(rest[0], int(rest[1]))
    if kind == "device-probe" and len(rest) == 1:
        from scaling.study.sweeps import devices

        return devices.device_probe_child(rest[0])
    sys.exit(__doc__)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
