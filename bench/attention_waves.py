"""Does the S = 1024 attention gap come from the persistent grid's last, partial round of work items?

At the target shapes (B*S = 16384, H*D = 2048) the persistent kernel (kernels/attention/attention_ws.py) has
B*H*8 one-tile items (full) or B*H*4 paired items (causal) at S = 1024, D = 128: 2048 or 1024 items on
132 SMs, 15.5 or 7.76 rounds, so the last round leaves a quarter to a half of the SMs idle. This script
measures the per-shape winner of the target runs and SDPA's cuDNN and flash backends, interleaved, at
the target batch and at batches whose item counts fill whole rounds (B = 33 at H = 16: 4224 and 2112
items, 32 and 16 rounds exactly) or leave a nearly empty last one (B = 32: 4096 and 2048 items). If the
ratio to cuDNN rises with whole rounds, the tail is the loss, and a finer-grained last round is the fix.

``--stream`` measures that fix beside the winner: the same config with ``STREAM_KV`` (the last round dealt out
to every SM by key blocks) as ``ws1``. At a batch of whole rounds both run the same tiles the same way (no
key block is left for the stream), so any difference there is the knob's cost in code, not its tail.
``--variant KNOB=VALUE`` does the same for another knob (ws0: the winner with the knob at its default, ws1: at
VALUE). ``--winners`` reads the winners from another target run.

    PYTHONPATH=. python bench/attention_waves.py --out bench/results/kernel-variants-attention-waves-h200.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from bench.attention_ws import _measurers
from bench.common import interleaved, median, write_result

#: The target runs whose S = 1024 winners are measured here.
WINNERS_FILE = Path(__file__).parent / "results" / "kernel-variants-attention-ws-oneloop-h200.json"


def winners(path: Path = WINNERS_FILE, seq_len: int = 1024) -> dict[tuple[int, bool], dict[str, Any]]:
    """The winning config per (head_dim, causal) at ``seq_len`` in a target run's ``attention`` entries."""
    entries = json.loads(path.read_text())["attention"]
    return {
        (e["shape"]["head_dim"], e["shape"]["causal"]): e["config"] for e in entries if e["shape"]["seq_len"] == seq_len
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--batches", type=int, nargs="+", default=[16, 32, 33])
    parser.add_argument("--head-dims", type=int, nargs="+", default=[128, 64])
    parser.add_argument("--stream", action="store_true", help="also the winner with STREAM_KV (ws1)")
    parser.add_argument("--variant", help="KNOB=VALUE: the winner with the knob at its default (ws0), at VALUE (ws1)")
    parser.add_argument("--winners", type=Path, default=WINNERS_FILE, help="target run to take the winners from")
    ns = parser.parse_args()
    import torch

    from kernels.attention.attention_ws_rules import KNOBS, work_items

    configs = winners(ns.winners)
    variant = {"STREAM_KV": True} if ns.stream else {}
    if ns.variant:
        knob, value = ns.variant.split("=")
        variant = {knob: json.loads(value)}
    default = {knob: KNOBS[knob] for knob in variant}
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows: list[dict[str, Any]] = []
    for d in ns.head_dims:
        heads = 2048 // d
        for causal in (True, False):
            for batch in ns.batches:
                shape = {"batch": batch, "heads": heads, "seq_len": 1024, "head_dim": d, "causal": causal}
                config = {**configs[(d, causal)], **default}
                measurers = _measurers(shape, [config, {**config, **variant}] if variant else [config])
                medians = {n: median(v) for n, v in interleaved(measurers, ns.rounds).items()}
                n_items = work_items(batch * heads, 1024, config["CONSUMERS"], causal)
                lib = max((n for n in ("cudnn", "flash") if medians.get(n)), key=lambda n: medians[n])
                row = {"shape": shape, "items": n_items, "rounds_of_items": round(n_items / sms, 3),
                       "last_round_filled": round((n_items / sms) % 1 or 1.0, 3),
                       "tflops": {n: round(m, 1) for n, m in medians.items() if m},
                       "ratio_to_" + lib: round(medians["ws0"] / medians[lib], 4)}  # fmt: skip
                if variant:
                    row["variant"] = variant
                    row["stream_over_winner" if ns.stream else "variant_over_winner"] = round(
                        medians["ws1"] / medians["ws0"], 4)
                rows.append(row)
                print(f"  D={d} {'causal' if causal else 'full'} B={batch}: {n_items} items "
                      f"({row['rounds_of_items']} rounds) {row['tflops']} ratio {row['ratio_to_' + lib]}",
                      flush=True)  # fmt: skip
                write_result({"benchmark": "persistent attention: last-round fill at S = 1024", "sms": sms,
                              "configs": {f"D={k[0]} {'causal' if k[1] else 'full'}": v for k, v in configs.items()},
                              "rows": rows}, ns.out)  # fmt: skip


if __name__ == "__main__":
    main()
