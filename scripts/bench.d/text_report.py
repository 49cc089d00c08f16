"""bench/text.{json,md}: the text bench's results (text.py measures, this writes)."""
import json
import os

from common import OUT
from text_priority import KINDS

LABELS = {"after": "vramfork (this build)", "before": "vramfork before",
          "infinity": "Infinity", "python": "sentence-transformers + LitServe"}
SHAPES = {"minilm": "a MiniLM-L6-shaped encoder (6 layers, width 384)",
          "bert-base": "a BERT-base-shaped encoder (12 layers, width 768)"}


def fmt(x, nd=2):
    return "—" if x is None else f"{x:.{nd}f}"


def write(res):
    with open(os.path.join(OUT, "text.json"), "w") as f:
        json.dump(res, f, indent=1)
    t = res["tokens"]
    md = [f"# Mixed-length inputs through `/v1/embeddings`\n\n`{res['command']}`, {res['when']}, "
          f"binaries of `{res['bin']}` (*before*: commit {res['before']}), {res['cpus']} CPUs "
          f"shared with the load generator; {SHAPES[res['shape']]}, random weights, max_length "
          f"{res['max_length']}. {res['n']} inputs cut from the docs (tokens an input, cut: p50 "
          f"{t['p50']}, p90 {t['p90']}, max {t['max']}, mean {t['mean']:.0f}; {t['under_64']} of "
          f"64 tokens or fewer, {t['cut']} cut at max_length) in requests of {res['k']}, base64 "
          f"vectors; c closed-loop clients; {res['rounds']} round(s), the sides interleaved; "
          "inputs/s: the median round's (every round's beside it); p50/p99: a request's, over "
          "every round; vramfork's requests answered by each of its workers (its access log: a "
          "keep-alive connection stays with the worker that accepted it). Threads: vramfork and LitServe 2 workers x 1 torch thread, Infinity "
          f"{res['infinity_version']} 1 process x {res['infinity_threads']} torch threads "
          "(torch engine, batch size 32 and length sorting as it ships). The sides' vectors "
          f"for the first {res['check_inputs']} inputs agree within "
          f"{max(res['max_abs_diff'].values()):.1e}. Run took {res['took_s'] / 60:.1f} min "
          f"(foretold {res['expected_s'] / 60:.1f} after the start).\n",
          "| c | " + " | ".join(f"{v} (inputs/s; p50, p99 ms)" for v in LABELS.values())
          + " | after ÷ before | after ÷ Infinity | after ÷ LitServe |",
          "|---:|" + "---|" * len(LABELS) + "---:|---:|---:|"]
    for r in res["rows"]:
        def side(k):
            s = r[k]
            return (f"**{fmt(s['inputs_s'], 1)}** ({', '.join(fmt(x, 1) for x in s['inputs_s_all'])}); "
                    f"{fmt(s['p50_ms'], 0)}, {fmt(s['p99_ms'], 0)}"
                    + (f"; {s['failed']} failed" if s["failed"] else "")
                    + (f"; by worker {' / '.join(str(v) for v in s['by_worker'].values())}"
                       if s.get("by_worker") else ""))
        md.append(f"| {r['c']} | " + " | ".join(side(k) for k in LABELS) + " | "
                  + " | ".join(f"**{fmt(r[f'after_over_{k}'])}**"
                               for k in ("before", "infinity", "python")) + " |")
    p = res["priority"]
    md += ["", f"## An interactive request beside a bulk ingestion (vramfork, this build)\n\n"
           f"Bulk: {p['bulk_clients']} closed-loop clients of {p['bulk_inputs']} mixed-length "
           f"inputs a request; interactive: one short input a request, {p['rate_per_s']:g} "
           f"arrivals a second (open loop, timed from the arrival) for {p['seconds']} s a round "
           f"(half that alone), {p['rounds']} round(s) of each mode with the bulk, alternating; "
           "every other arrival on a new connection, the others on a pool of keep-alive "
           f"connections ({p['pool']} opened before the bulk, more opened when none is idle). "
           "*priority*: the bulk sends `\"priority\": 1`, the interactive `\"priority\": -1` "
           "(vLLM's field; lower is earlier).\n",
           "The field: " + "; ".join(
               f"{k} answered {v['status']}" + (f" ({v['message']!r})" if "message" in v else "")
               for k, v in p["probe"].items())
           + ("; the priority mode is left out." if p["refused"] else ".")
           + " The access log, by mode (each round's requests with a bulk): "
           + "; ".join(f"*{mode}*: " + ", ".join(
               f"{kind} lanes {v[kind]['lanes']}, waited p50 {fmt(v[kind]['wait_ms_p50'], 0)} / "
               f"p99 {fmt(v[kind]['wait_ms_p99'], 0)} ms, model p50 "
               f"{fmt(v[kind]['model_ms_p50'], 0)} ms" for kind in ("interactive", "bulk"))
               for mode, rounds in p["access_log"].items() for v in rounds) + ".\n",
           "| mode | " + " | ".join(f"{k}: p50, p99 ms (requests)" for k in KINDS)
           + " | failed | bulk inputs/s |", "|---|" + "---:|" * len(KINDS) + "---|---|"]
    for mode, m in p["modes"].items():
        bulk = ", ".join(fmt(x, 0) for x in m["bulk_inputs_s"]) if m["bulk_inputs_s"] else "—"
        failed = {f"{k} {st}": n for k in KINDS for st, n in m[k]["failed"].items()}
        md.append(f"| {mode} | " + " | ".join(
            f"{fmt(m[k]['p50_ms'], 0)}, **{fmt(m[k]['p99_ms'], 0)}** ({m[k]['requests']})"
            for k in KINDS) + f" | {failed or '—'} | {bulk} |")
    with open(os.path.join(OUT, "text.md"), "w") as f:
        f.write("\n".join(md) + "\n")
    print("\n".join(md))
