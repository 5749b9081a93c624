#!/usr/bin/env python3
"""Summarize nvidia-smi samples taken beside a benchmark:
`nvidia-smi --query-gpu=power.draw,clocks.sm,clocks_throttle_reasons.active --format=csv,noheader[,nounits] -lms N`.
Prints the mean power and SM clock over the busy samples (power above --busy watts, default 250) and the share of
them throttled by the software power cap (reason bit 0x4).

usage: smi_summary.py FILE [--busy W]"""
import re
import sys


def summarize(lines, busy=250.0):
    n = capped = 0
    watts = mhz = 0.0
    for ln in lines:
        f = [x.strip() for x in ln.split(",")]
        if len(f) < 3:
            continue
        try:
            p = float(re.sub(r"[^0-9.]", "", f[0]))  # "693.12" or "693.12 W"
            c = float(re.sub(r"[^0-9.]", "", f[1]))
            r = int(f[2], 16)
        except ValueError:
            continue
        if p < busy:
            continue
        n += 1
        watts += p
        mhz += c
        capped += (r & 0x4) != 0
    if n == 0:
        return None
    return {"samples": n, "watts": watts / n, "sm_mhz": mhz / n, "power_capped": capped / n}


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    busy = float(sys.argv[sys.argv.index("--busy") + 1]) if "--busy" in sys.argv else 250.0
    with open(sys.argv[1]) as fh:
        r = summarize(fh, busy)
    if r is None:
        print("no busy samples")
        return
    print(f"{r['watts']:.0f} W, SM {r['sm_mhz']:.0f} MHz, power-capped in {100 * r['power_capped']:.0f}% of "
          f"{r['samples']} busy samples")


if __name__ == "__main__":
    main()
