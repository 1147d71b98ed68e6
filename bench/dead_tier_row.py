"""The dead-tier row of ``make bench``: ours with each child's health machine (the breaker)
against ours without it, in a real vLLM engine whose second child's store is down for a while,
then back (issue #48). vLLM's ``MultiConnector`` is not a side: a child that raises in a lookup
fails its engine's step.

Run in the engine environment (``.venv-engine``), after ``python -m bench.run``: it prints its
rows and merges them into ``build/bench.json`` (``--json``) under ``dead_tier``.

Both engines have the same two children: ``live``, a tier that works (``DelayedSaveConnector``
with ``disk: false``, saves reported 2 steps late), and ``dead``
(``bench.engine_children.DeadTierConnector``, saves 3 steps late), whose store is down for the
first half of each round's arrivals: each of its lookups then waits ``FAIL_SECONDS`` (a remote
store's connect timeout) and raises ``ConnectionError``; then it is back, and answers (a miss:
the prompts are fresh). The breaker's engine has ``kv_connector_extra_config['health']`` =
``HEALTH``; the other has no ``health`` key. A round adds ``PER_STEP`` fresh prompts of
``PROMPT_TOKENS`` tokens at each engine step until ``--prompts`` are in, then steps until every
request finished and every save was reported. The two engines run in two processes, interleaved
as the engine row's (``bench.engine_row.measure``: ABBA rounds, fresh pairs of processes, the
median of the per-repeat ratios with its interquartile range), on the same prompts.

Per side and round: the engine thread's CPU time and the wall time per generated token, the
requests served and a digest of their tokens (equal between the sides, round by round), the
dead child's lookups asked, skipped and failed (``child_hits()``, ``child_failures()``, and the
child's own count), and, with the breaker, each health transition of the dead child with its
step, from which the step it was readmitted (``half_open -> closed``) after its store came back.
"""

from __future__ import annotations

import hashlib
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from . import engine_harness as h
from .engine_row import (
    MARK,
    _bounded,
    _line,
    check_pairs,
    measure,
    merge,
    row_parser,
    serve_arguments,
)

#: The two sides: ours with ``health``, ours without it.
SIDES = ("breaker", "none")
#: The breaker's options: its cooldowns scaled to engine steps of about 10 ms on the tiny model
#: (the defaults, 10 s and 300 s, fit a server's hours, not a benchmark's rounds of a second).
HEALTH: dict[str, Any] = {
    "threshold": 5,
    "window_seconds": 60,
    "cooldown_seconds": 0.025,
    "max_cooldown_seconds": 0.1,
    "probes": 3,
}
#: Fresh requests added at each step of a round, until the round's prompts are in.
PER_STEP = 4
#: The dead child's store is down for this share of a round's arrival steps, from its start.
DOWN_SHARE = 0.5
#: How long a lookup of the dead child waits before it raises (a connect timeout), unless
#: ``--fail-seconds`` says otherwise (passed to the engine processes in :data:`FAIL_ENV`).
FAIL_SECONDS = 0.005
FAIL_ENV = "BENCH_DEAD_TIER_FAIL_SECONDS"
PROMPT_TOKENS = 32
DEAD = "dead"


def transfer(side: str, storage: Path, fail_seconds: float = FAIL_SECONDS) -> dict[str, Any]:
    """The engine's KV transfer config: ``live`` and ``dead`` (its failing lookups waiting
    ``fail_seconds``), with ``health`` on the breaker's side only."""
    children = [
        h.example_child(
            storage / "live",
            "live",
            None,
            "DelayedSaveConnector",
            save_delay_steps=2,
            disk=False,
            multiconnector_name="live",
        ),
        h.example_child(
            storage / DEAD,
            DEAD,
            None,
            "DeadTierConnector",
            save_delay_steps=3,
            disk=False,
            fail_seconds=fail_seconds,
            multiconnector_name=DEAD,
        ),
    ]
    config = h.multi_config(children)
    if side == "breaker":
        config["kv_connector_extra_config"]["health"] = dict(HEALTH)
    return config


def plan(prompts: int, per_step: int = PER_STEP) -> tuple[list[int], int]:
    """A round's arrivals: how many requests each step adds (``per_step``, the last step the
    rest), and for how many steps from the start the dead child's store is down."""
    arrivals = [per_step] * (prompts // per_step)
    if prompts % per_step:
        arrivals.append(prompts % per_step)
    return arrivals, round(len(arrivals) * DOWN_SHARE)


def readmission(changes: list[list[Any]], recovered: int) -> list[Any] | None:
    """The dead child's readmission once its store is back: ``[steps, seconds]`` after the
    recovery (``steps`` 1: within the first step after it), from its health ``changes``
    (``[step, state, seconds after the recovery]``, each step counted from 0, the recovery
    just before step ``recovered``); ``None`` when it was not closed again within the round."""
    for step, state, seconds in changes:
        if step >= recovered and state == "closed":
            return [step - recovered + 1, seconds]
    return None


def _dead_counts(connector: Any) -> dict[str, int]:
    """What ours counted of the dead child so far: lookups asked, skipped (open), failed."""
    hits = connector.child_hits().get(DEAD, {})
    failures = connector.child_failures().get(DEAD, {})
    return {
        "asked": hits.get("asked", 0),
        "skipped": hits.get("skipped", 0),
        "failed": failures.get("get_num_new_matched_tokens", 0),
    }


def one_round(llm: Any, seed: int, prompts: int, tokens: int) -> dict[str, Any]:
    """One round in this engine process: the dead child down for the first part of the
    arrivals, then back; the figures of :func:`measure`'s answers and this row's own."""
    from vllm import SamplingParams  # noqa: PLC0415 - vLLM: the engine environment only
    from vllm.inputs import TokensPrompt  # noqa: PLC0415

    from . import engine_children as children  # noqa: PLC0415 - it imports vLLM

    engine = llm.llm_engine
    core = h.engine_core(llm)
    connector = core.scheduler.connector
    params = SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True)
    batch = h.prompts(prompts, PROMPT_TOKENS, seed=seed)
    arrivals, down = plan(prompts)
    before, own = _dead_counts(connector), dict(children.DEAD.get(DEAD, {}))
    index: dict[str, int] = {}
    outputs: dict[int, list[int]] = {}
    changes: list[list[Any]] = []
    last = connector.child_health().get(DEAD)
    children.DOWN.add(DEAD)
    recovered_at = 0.0
    cpu, wall, main = time.process_time(), time.perf_counter(), time.thread_time()
    step = 0
    while step < len(arrivals) or engine.has_unfinished_requests():
        if step == down:
            children.DOWN.discard(DEAD)
            recovered_at = time.perf_counter()
        for _ in range(arrivals[step] if step < len(arrivals) else 0):
            number = len(index)
            prompt = TokensPrompt(prompt_token_ids=batch[number])
            name = f"{seed}-{number}"
            engine.add_request(name, prompt, params)
            index[name] = number
        for output in engine.step():
            if output.finished:
                outputs[index[output.request_id]] = list(output.outputs[0].token_ids)
        state = connector.child_health().get(DEAD)
        if state != last:
            seconds = time.perf_counter() - recovered_at if step >= down else None
            changes.append([step, None if state is None else state.value, seconds])
            last = state
        step += 1
    children.DOWN.discard(DEAD)
    drain = 0
    while core.scheduler.requests:  # the late saves: the connectors' work too
        engine.step()
        drain += 1
    main = time.thread_time() - main
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    after = _dead_counts(connector)
    own_after: dict[str, int] = dict(children.DEAD.get(DEAD, {}))
    generated = sum(len(t) for t in outputs.values())
    ordered = [outputs.get(n, []) for n in range(prompts)]
    return {
        "seed": seed,
        "cpu": cpu,
        "main": main,
        "wall": wall,
        "tokens": generated,
        "requests": prompts,
        "served": sum(len(t) == tokens for t in outputs.values()),
        "digest": hashlib.sha256(json.dumps(ordered).encode()).hexdigest()[:16],
        "steps": step,
        "drain_steps": drain,
        "down_steps": down,
        "dead": {k: after[k] - before[k] for k in after},
        "dead_own": {k: own_after.get(k, 0) - own.get(k, 0) for k in ("lookups", "failed")},
        "changes": changes,
        "readmitted": readmission(changes, down),
    }


def serve(side: str, model: Path, prompts: int, tokens: int) -> None:
    """One engine, one side: a round per line on stdin (its seed), each answered on stdout."""
    with tempfile.TemporaryDirectory() as storage:
        fail_seconds = float(os.environ.get(FAIL_ENV, FAIL_SECONDS))
        llm, ready = h.bench_llm(model, transfer(side, Path(storage), fail_seconds))
        ready["health"] = {
            k: v.value for k, v in h.engine_core(llm).scheduler.connector.child_health().items()
        }
        print(MARK + json.dumps(ready), flush=True)
        for line in sys.stdin:
            answer = one_round(llm, int(line), prompts, tokens)
            print(MARK + json.dumps(answer), flush=True)
        h.shut(llm)


def summary(figures: dict[str, Any]) -> dict[str, Any]:
    """What the rounds of ``figures["answers"]`` (:func:`measure` with ``keep``) come to: the
    requests served and whether both sides' tokens are equal round by round, the dead child's
    lookups per round (medians), and the breaker's readmissions."""
    answers: dict[str, list[dict[str, Any]]] = figures["answers"]
    digests = {side: {a["seed"]: a["digest"] for a in answers[side]} for side in SIDES}
    served = {side: [sum(a["served"] for a in answers[side]),
                     sum(a["requests"] for a in answers[side])] for side in SIDES}  # fmt: skip
    dead = {
        side: {
            count: statistics.median(a["dead"][count] for a in answers[side])
            for count in ("asked", "skipped", "failed")
        }
        for side in SIDES
    }
    spared = [
        none["dead"]["failed"] - breaker["dead"]["failed"]
        for breaker, none in zip(answers["breaker"], answers["none"], strict=True)
    ]
    readmitted = [a["readmitted"] for a in answers["breaker"]]
    back = [r for r in readmitted if r is not None]
    return {
        "served": served,
        "all_served": all(done == asked for done, asked in served.values()),
        "tokens_equal": digests["breaker"] == digests["none"] and bool(digests["none"]),
        "rounds": len(answers["breaker"]),
        "dead": dead,
        "failed_lookups_spared": statistics.median(spared),
        "lookups_down": statistics.median(a["down_steps"] * PER_STEP for a in answers["none"]),
        "readmitted_steps": [r[0] for r in back],
        "readmitted_seconds": [r[1] for r in back],
        "not_readmitted": len(readmitted) - len(back),
    }


def rows(figures: dict[str, Any]) -> list[dict[str, Any]]:
    """The table rows (``bench/run.py``'s Row fields; p90 holds the third quartile, or the
    largest readmission)."""
    said = figures["summary"]
    (done, asked), (other, other_asked) = said["served"].values()
    served = 100.0 * (done + other) / (asked + other_asked)
    steps = said["readmitted_steps"] or [float("nan")]
    nan = float("nan")
    return [
        {"name": "dead tier: engine CPU per token, breaker ÷ none", "median": figures["ratio"],
         "p90": figures["ratio_q3"], "unit": "x", "target": "", "met": None},
        {"name": "dead tier: wall time per token, breaker ÷ none",
         "median": figures["wall_ratio"], "p90": figures["wall_ratio_iqr"][1], "unit": "x",
         "target": "", "met": None},
        {"name": "dead tier: the dead child's failed lookups a round, breaker",
         "median": said["dead"]["breaker"]["failed"], "p90": nan, "unit": "calls",
         "target": "", "met": None},
        {"name": "dead tier: the dead child's failed lookups a round, none",
         "median": said["dead"]["none"]["failed"], "p90": nan, "unit": "calls", "target": "",
         "met": None},
        {"name": "dead tier: steps from its store's return to its readmission",
         "median": statistics.median(steps), "p90": max(steps), "unit": "steps",
         "target": "every round", "met": said["not_readmitted"] == 0},
        {"name": "dead tier: requests served, both engines", "median": served, "p90": nan,
         "unit": "%", "target": "all, tokens equal",
         "met": said["all_served"] and said["tokens_equal"]},
    ]  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = row_parser(
        "bench.dead_tier_row",
        __doc__,
        prompts=160,
        tokens=8,
        repeats=16,
        pairs=2,
        least_prompts=2 * PER_STEP,
        prompts_help=f"requests a round, {PER_STEP} a step (at least {2 * PER_STEP})",
    )
    parser.add_argument("--blocks", type=_bounded(1), default=2, help="ABBA blocks a repeat")
    parser.add_argument(
        "--fail-seconds",
        type=float,
        default=FAIL_SECONDS,
        help=f"how long a failing lookup waits before it raises (default {FAIL_SECONDS:g}; 0: "
        "at once)",
    )
    serve_arguments(parser, SIDES)
    args = parser.parse_args(argv)
    if args.serve:
        serve(args.serve, args.model, args.prompts, args.tokens)
        return 0
    if args.quick:
        args.prompts, args.tokens, args.repeats, args.blocks, args.pairs = 16, 4, 2, 1, 1
    check_pairs(parser, args)
    if not 0 <= args.fail_seconds <= 1:
        parser.error(f"--fail-seconds {args.fail_seconds:g} must be within 0 and 1")
    os.environ[FAIL_ENV] = repr(args.fail_seconds)  # the engine processes read it
    started = time.perf_counter()
    figures = measure(
        args.prompts,
        args.tokens,
        args.repeats,
        args.blocks,
        SIDES,
        pairs=args.pairs,
        module="bench.dead_tier_row",
        keep=True,
    )
    figures["seconds"] = time.perf_counter() - started
    figures["health"] = HEALTH
    figures["fail_seconds"] = args.fail_seconds
    figures["summary"] = said = summary(figures)
    table = rows(figures)
    print("| figure | median | target | met |\n|---|---|---|---|")
    for row in table:
        print(_line(row))
    seconds = [f"{s:.2f}" for s in said["readmitted_seconds"]]
    print(
        f"\ndead tier, breaker ÷ none: {args.prompts} prompts x {args.tokens} tokens a round, "
        f"{args.repeats} repeats in {args.pairs} pair(s) of processes, {figures['seconds']:.0f} s;"
        f" CPU ratio {figures['ratio']:.4f} (IQR {figures['ratio_q1']:.4f}.."
        f"{figures['ratio_q3']:.4f}), wall ratio {figures['wall_ratio']:.4f} (IQR "
        f"{figures['wall_ratio_iqr'][0]:.4f}..{figures['wall_ratio_iqr'][1]:.4f}); the dead "
        f"child a round (medians): {said['dead']}, {said['lookups_down']} lookups while down, "
        f"{said['failed_lookups_spared']} failed ones spared; readmitted after "
        f"{said['readmitted_steps']} steps ({', '.join(seconds)} s), not within "
        f"{said['not_readmitted']} round(s)"
    )
    if args.json:
        merge(args.json, {"dead_tier": figures}, table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
