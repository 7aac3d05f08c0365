"""Parameters of a synthetic run, and the limits that keep them meaningful.

Validation lives next to the fields so that the library and ``dsim synth``
refuse the same impossible runs, with the CLI's option names, before anything
is written. All model times are integer microseconds (the resolution of the
printed timestamps), so the printed values are exact and a parse round trip
gives back the model's numbers; the conversions to and from that unit live
here too.
"""

from __future__ import annotations

import datetime as dt
import math
from dataclasses import dataclass

from dsim.errors import UsageError
from dsim.io.names import check_run_name

US_PER_S = 1_000_000
US_PER_DAY = 86_400 * US_PER_S
#: ``dsim parse``'s default ``--max-duration`` (one day): synth writes no run it rejects.
_PARSE_MAX_DURATION_S = 86_400.0
UNIX_EPOCH = dt.datetime(1970, 1, 1)


def to_us(moment: dt.datetime) -> int:
    """Microseconds since 1970 (naive, like the timestamps the logs print)."""
    delta = moment.replace(tzinfo=None) - UNIX_EPOCH
    return (delta.days * 86_400 + delta.seconds) * US_PER_S + delta.microseconds


@dataclass(frozen=True)
class SynthParams:
    """Everything that determines a synthetic run; equal params give identical bytes."""

    gpus: int
    iterations: int  # per epoch
    epochs: int
    workers: int  # DataLoader workers per rank
    prefetch: int = 2  # batches in flight per worker (PyTorch's prefetch_factor)
    seed: int = 0
    fetch_mean_s: float = 1.0  # mean time for one worker to build one batch
    fetch_cv: float = 0.2  # coefficient of variation of the fetch time
    skew: float = 0.0  # the last rank's fetches are (1 + skew) times slower than rank 0's
    straggler_prob: float = 0.01
    straggler_factor: float = 4.0
    compute_s: float = 0.25  # forward + backward per iteration
    allreduce_s: float = 0.02
    batch_size: int = 256  # samples per rank and iteration (for Throughput)
    name: str | None = None
    per_rank: bool = False  # one rank<N>.log per rank instead of one interleaved output.log
    start: dt.datetime = dt.datetime(2021, 9, 1, 0, 0, 0)

    @property
    def run_name(self) -> str:
        """The run directory's name; the default follows the naming scheme of docs/SPEC.md §1.1."""
        if self.name is not None:
            return self.name
        return (
            f"synth_queue_seed{self.seed}_gpus{self.gpus}_epoch{self.epochs}"
            f"_b{self.batch_size * self.gpus}_worker{self.workers}_thread0"
        )

    @property
    def lines(self) -> int:
        """Lines the run will have: one fetch and one training line per rank and iteration."""
        return 2 * self.gpus * self.iterations * self.epochs

    def validate(self) -> None:
        """Refuse impossible parameters before anything is written."""
        for field_name, minimum in (
            ("gpus", 1),
            ("iterations", 1),
            ("epochs", 1),
            ("workers", 1),
            ("prefetch", 1),
            ("batch_size", 1),
            ("seed", 0),
        ):
            value = getattr(self, field_name)
            if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
                raise UsageError(
                    f"{_option(field_name)} must be an integer >= {minimum}, got {value}"
                )
        for field_name, low, low_open, high in (
            ("fetch_mean_s", 0.0, True, None),
            ("fetch_cv", 0.0, False, None),
            ("skew", 0.0, False, None),
            ("straggler_prob", 0.0, False, 1.0),
            ("straggler_factor", 1.0, False, None),
            ("compute_s", 0.0, True, None),
            ("allreduce_s", 0.0, False, None),
        ):
            value = getattr(self, field_name)
            bad = not isinstance(value, int | float) or not math.isfinite(value)
            bad = bad or (value <= low if low_open else value < low)
            bad = bad or (high is not None and value > high)
            if bad:
                bound = f"> {low}" if low_open else f">= {low}"
                if high is not None:
                    bound += f" and <= {high}"
                raise UsageError(
                    f"{_option(field_name)} must be a finite number {bound}, got {value}"
                )
        if self.batch_size > 10**7:
            raise UsageError(f"--batch-size must be at most 10000000, got {self.batch_size}")
        if round(self.fetch_mean_s * US_PER_S) < 1 or round(self.compute_s * US_PER_S) < 1:
            raise UsageError("--fetch-mean and --compute must be at least 1 microsecond")
        slowest = self.fetch_mean_s * (1 + self.skew) * self.straggler_factor * 10
        if self.iterations * self.epochs * (slowest + self.compute_s + self.allreduce_s) > 3e10:
            raise UsageError("this run would last for centuries; lower the times or the size")
        straggler = self.fetch_mean_s * (1 + self.skew) * self.straggler_factor
        if max(straggler, self.compute_s + self.allreduce_s) >= _PARSE_MAX_DURATION_S:
            raise UsageError(  # --fetch-mean 1e5 wrote logs whose own parse rejected half
                "a fetch or an iteration of this run would last a day or more (--fetch-mean "
                "× (1 + --skew) × --straggler-factor, or --compute + --allreduce), which "
                "dsim parse rejects (--max-duration, a day by default); lower the times"
            )
        if self.name is not None:
            check_run_name(self.name)  # the rule every command applies to run names


def _option(field_name: str) -> str:
    return "--" + field_name.removesuffix("_s").replace("_", "-")
