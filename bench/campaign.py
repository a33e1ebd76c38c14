"""A soak of the fault campaign on a stack of its own: schedules drawn from consecutive seeds
(and the named ones, one per hole a reading found), each judged by every checker
(``tests/support/campaign``). Prints, per invariant, how many schedules it judged and how many
broke it, with the seeds that failed (each reproduces with ``--first-seed N --schedules 1``),
then one JSON line.

    .venv/bin/python -m bench.campaign [--schedules 200] [--first-seed 0] [--no-named]
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from collections import Counter

from bench.common import own_stack
from eventfold.local_stack import LocalStack
from eventfold.projections.execution.spark import spark_session
from eventfold.wiring import spark_conf
from tests.support.campaign.checkers import CHECKERS
from tests.support.campaign.run import Campaign, Outcome
from tests.support.campaign.schedule import LEASE_S, NAMED, draw


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--schedules", type=int, default=200)
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--no-named", action="store_true",
                        help="only drawn schedules, not the named ones")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(message)s")
    schedules = [draw(seed, LEASE_S)
                 for seed in range(args.first_seed, args.first_seed + args.schedules)]
    if not args.no_named:
        schedules += NAMED.values()
    outcomes: list[Outcome] = []
    started = time.monotonic()
    with own_stack("eventfold-campaign-") as (settings, root):
        settings = settings.model_copy(update={"stack_dir": root / "stack"})
        spark = spark_session("local[2]", app_name="eventfold-campaign",
                              extra_conf=spark_conf(settings))
        try:
            campaign = Campaign(settings, LocalStack(root / "stack"), lease_s=LEASE_S)
            for number, schedule in enumerate(schedules, 1):
                outcome = campaign.run(schedule)
                outcomes.append(outcome)
                print(f"[{number}/{len(schedules)}] {'FAILED ' if outcome.failed else ''}"
                      f"{outcome.describe()}", flush=True)
        finally:
            spark.stop()
    report(outcomes, time.monotonic() - started)


def report(outcomes: list[Outcome], seconds: float) -> None:
    violations: Counter[str] = Counter()
    failed: dict[str, list[int]] = {}
    for outcome in outcomes:
        for invariant, found in outcome.violations.items():
            if found:
                violations[invariant] += 1
                failed.setdefault(invariant, []).append(outcome.schedule.seed)
    invariants = [*CHECKERS, "caught_up", "actors_ran"]
    print(f"\n{len(outcomes)} schedules in {seconds:.0f} s "
          f"({seconds / max(len(outcomes), 1):.1f} s each)")
    for invariant in invariants:
        print(f"  {invariant:<24} {len(outcomes):>5} judged, {violations[invariant]:>3} broke it"
              + (f" (seeds {', '.join(map(str, failed[invariant]))})"
                 if invariant in failed else ""))
    struck = sum(bool(o.struck) for o in outcomes)
    print(f"  faults struck in {struck} schedules, not reached in "
          f"{sum(bool(o.unreached) for o in outcomes)}")
    failed_seeds = sorted({o.schedule.seed for o in outcomes if o.failed})
    print(json.dumps({"schedules": len(outcomes), "violations": sum(violations.values()),
                      "violations_by_invariant": {i: violations[i] for i in invariants},
                      "failed_seeds": failed_seeds, "campaign_seconds": round(seconds, 1),
                      "schedule_mean_s": round(seconds / max(len(outcomes), 1), 2)}))


if __name__ == "__main__":
    main()
