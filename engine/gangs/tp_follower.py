"""A tensor-parallel follower process: ``python -m engine.gangs.tp_follower MODEL_JSON
ENGINE_JSON INIT_METHOD RANK`` (what :func:`~engine.gangs.tp_gang.start_gang` runs).

Exits 0 when rank 0 stopped the gang, 1 (with the reason on stderr) when it broke.
"""

from __future__ import annotations

import logging
import sys

from engine.gangs.tp_gang import run_follower


def main(argv: list[str]) -> int:
    """Run one follower; the exit status."""
    if len(argv) != 4:
        print(__doc__, file=sys.stderr)
        return 2
    model_json, engine_json, init_method, rank = argv
    logging.basicConfig(level=logging.INFO, format=f"tp-rank{rank} %(levelname)s %(message)s")
    try:
        run_follower(model_json, engine_json, init_method, int(rank))
    except Exception as e:  # the gang is broken: say why, exit non-zero
        logging.getLogger("engine.gangs.tp_follower").error("follower stopped: %s", e)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
