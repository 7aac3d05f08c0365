"""Mutate raw logs while tracking where every line came from, and judge the parse of a mutant.

A mutant is a copy of a log (a run directory of ``*.log`` files) with a few
edits: lines dropped, duplicated or inserted, bytes flipped, digits changed,
fields swapped, lines cut short, lines stretched about the line limit
(``LONG_EDITS``). Every line of the mutant remembers the
original line it came from (``origin``) and whether its text was changed, so
that each record the parser keeps can be traced back to a line of the
original log -- line numbers shift with every insertion and drop.

The oracle (``check``) states what "a defect stays local" means (a run with a
line over ``LINE_LIMIT`` must instead fail naming the first such line):

(b) every record kept from an *unchanged* line is that line's record in the
    parse of the original log (same GPU, iteration and values; same epoch
    too, unless both its old and its new iteration are touched, see below);
(c) every iteration that no edit *touched* has exactly its original records,
    fetch and training, no more and no fewer.

An edit touches the iteration of the record its line held, and, for a
changed line that still reads as a record, what that record can reach:
its own iteration (for a fetch, in any epoch -- its epoch comes from its
time, which may have changed; for a training line, in its epoch and the
epochs next to it, whose same-numbered fetch it can relabel), and the
iterations of the records within ``dsim.sources.rawlog.clock.K`` of its place in its clock
group (the records the outlier rule may blame instead of it when the order
alone cannot tell which one is wrong).
"""

from __future__ import annotations

import random
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from dsim.errors import InputError
from dsim.sources.rawlog import grammar
from dsim.sources.rawlog.clock import K
from dsim.sources.rawlog.discover import RunSource, rank_from_file_name
from dsim.sources.rawlog.parse import ParsedRun, parse_run


@dataclass
class Piece:
    """One line of a mutant (it may hold newlines after an edit: then several lines)."""

    text: bytes
    origin: int | None  # 0-based line of the original file; None for inserted lines
    changed: bool = False
    copy: bool = False  # an exact copy of its origin line, inserted after it


@dataclass
class Mutant:
    """A log under edit: per file, its pieces; and what was done, for messages."""

    pieces: dict[str, list[Piece]]
    final_newline: dict[str, bool]
    dropped: set[tuple[str, int]] = field(default_factory=set)
    edits: list[str] = field(default_factory=list)

    @classmethod
    def of(cls, directory: Path) -> Mutant:
        pieces, final = {}, {}
        for path in sorted(directory.glob("*.log")):
            data = path.read_bytes()
            final[path.name] = data.endswith(b"\n")
            lines = data.split(b"\n")
            if final[path.name]:
                lines.pop()
            pieces[path.name] = [Piece(text, i) for i, text in enumerate(lines)]
        return cls(pieces, final)

    def write(self, directory: Path) -> dict[str, list[Piece]]:
        """Write the files; return, per file, one piece per physical line (1-based: index + 1)."""
        directory.mkdir(parents=True, exist_ok=True)
        physical: dict[str, list[Piece]] = {}
        for name, pieces in self.pieces.items():
            rows = []
            for piece in pieces:
                parts = piece.text.split(b"\n")
                split = len(parts) > 1
                rows += [Piece(p, piece.origin, piece.changed or split, piece.copy) for p in parts]
            physical[name] = rows
            text = b"\n".join(p.text for p in rows) + (b"\n" if self.final_newline[name] else b"")
            (directory / name).write_bytes(text)
        return physical

    # -- edits ---------------------------------------------------------------------------

    def _pick(self, rng: random.Random) -> tuple[str, int] | None:
        """A random piece that still is an unchanged original line (each line is edited once)."""
        names = list(self.pieces)
        for _ in range(50):
            name = rng.choice(names)
            pieces = self.pieces[name]
            if not pieces:
                continue
            k = rng.randrange(len(pieces))
            p = pieces[k]
            if p.origin is not None and not p.changed and not p.copy and not self._copied(name, k):
                return name, k
        return None

    def _copied(self, name: str, k: int) -> bool:
        pieces = self.pieces[name]
        return k + 1 < len(pieces) and pieces[k + 1].copy

    def _change(self, name: str, k: int, text: bytes, what: str) -> None:
        piece = self.pieces[name][k]
        self.edits.append(f"{what} {name}:{piece.origin + 1}")
        self.pieces[name][k] = Piece(text, piece.origin, changed=True)

    def drop(self, rng: random.Random) -> None:
        if (pick := self._pick(rng)) is not None:
            name, k = pick
            piece = self.pieces[name].pop(k)
            self.dropped.add((name, piece.origin))
            self.edits.append(f"drop {name}:{piece.origin + 1}")

    def duplicate(self, rng: random.Random) -> None:
        if (pick := self._pick(rng)) is not None:
            name, k = pick
            piece = self.pieces[name][k]
            self.pieces[name].insert(k + 1, Piece(piece.text, piece.origin, copy=True))
            self.edits.append(f"duplicate {name}:{piece.origin + 1}")

    def corrupt(self, rng: random.Random) -> None:
        """Make a line unreadable: a run of its characters replaced by letters."""
        if (pick := self._pick(rng)) is not None:
            name, k = pick
            text = self.pieces[name][k].text
            i = rng.randrange(len(text) + 1)
            junk = bytes(rng.choice(b"xyzq") for _ in range(rng.randint(1, 4)))
            self._change(name, k, text[:i] + junk + text[i + len(junk) :], "corrupt")

    def digit(self, rng: random.Random) -> None:
        """Change one digit of a number (a time, a rank, an index, a value)."""
        if (pick := self._pick(rng)) is not None:
            name, k = pick
            text = self.pieces[name][k].text
            places = [m.start() for m in re.finditer(rb"\d", text)]
            if places:
                i = rng.choice(places)
                new = rng.choice([d for d in b"0123456789" if d != text[i]])
                self._change(name, k, text[:i] + bytes([new]) + text[i + 1 :], "digit")

    def flip(self, rng: random.Random) -> None:
        """Flip the bits of one byte (any byte may come out, newline and NUL included)."""
        if (pick := self._pick(rng)) is not None:
            name, k = pick
            text = self.pieces[name][k].text
            if text:
                i = rng.randrange(len(text))
                new = text[i] ^ rng.randint(1, 255)
                self._change(name, k, text[:i] + bytes([new]) + text[i + 1 :], "flip")

    def swap(self, rng: random.Random) -> None:
        """Swap two whitespace-separated fields of a line."""
        if (pick := self._pick(rng)) is not None:
            name, k = pick
            tokens = re.split(rb"(\s+)", self.pieces[name][k].text)
            words = [i for i, t in enumerate(tokens) if t and not t.isspace()]
            if len(words) >= 2:
                a, b = rng.sample(words, 2)
                tokens[a], tokens[b] = tokens[b], tokens[a]
                self._change(name, k, b"".join(tokens), "swap")

    def cut(self, rng: random.Random) -> None:
        """Cut a line short (the line end stays)."""
        if (pick := self._pick(rng)) is not None:
            name, k = pick
            text = self.pieces[name][k].text
            self._change(name, k, text[: rng.randrange(len(text) + 1)], "cut")

    def insert(self, rng: random.Random) -> None:
        """Insert a line of garbage: text or binary, newlines and all."""
        name = rng.choice(list(self.pieces))
        alphabet = rng.choice([b"abc 0123456789:.-[]/\t", bytes(range(256))])
        junk = bytes(rng.choice(alphabet) for _ in range(rng.randint(0, 80)))
        k = rng.randint(0, len(self.pieces[name]))
        self.pieces[name].insert(k, Piece(junk, None, changed=True))
        self.edits.append(f"insert {name} before piece {k}")

    def splice(self, rng: random.Random) -> None:
        """Insert garbage bytes inside a line."""
        if (pick := self._pick(rng)) is not None:
            name, k = pick
            text = self.pieces[name][k].text
            i = rng.randrange(len(text) + 1)
            junk = bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
            self._change(name, k, text[:i] + junk + text[i:], "splice")

    def long(self, rng: random.Random) -> None:
        """Stretch a line to about ``LINE_LIMIT`` bytes (either side of it, or far past it)."""
        if (pick := self._pick(rng)) is not None:
            name, k = pick
            text = self.pieces[name][k].text
            size = rng.choice([LINE_LIMIT - 1, LINE_LIMIT, LINE_LIMIT + 1, 3 * LINE_LIMIT])
            size = max(size + rng.randint(-3, 3) * (size > LINE_LIMIT + 1), len(text))
            tail = bytes(rng.choice(b"x (0.5)\t") for _ in range(size - len(text)))
            self._change(name, k, text + tail, "long")

    def truncate(self, rng: random.Random) -> None:
        """Cut the file inside its last line: no line end, as after a crash."""
        name = rng.choice(list(self.pieces))
        pieces = self.pieces[name]
        if pieces and pieces[-1].origin is not None and not pieces[-1].changed:
            text = pieces[-1].text
            self._change(name, len(pieces) - 1, text[: rng.randrange(len(text) + 1)], "truncate")
            self.final_newline[name] = False


PROPERTY_EDITS = ("drop", "duplicate", "corrupt", "digit")
FUZZ_EDITS = (*PROPERTY_EDITS, "flip", "swap", "cut", "insert", "splice", "truncate")
LONG_EDITS = (*FUZZ_EDITS, "long")  # lines about the line limit: some runs then fail whole
LINE_LIMIT = 4096  # the fuzzer's --max-line-bytes: small, so that long lines cost little


def mutate(directory: Path, rng: random.Random, count: int, kinds=FUZZ_EDITS) -> Mutant:
    mutant = Mutant.of(directory)
    for _ in range(count):
        getattr(mutant, rng.choice(kinds))(rng)
    return mutant


# -- records, by where they came from ------------------------------------------------------


@dataclass(frozen=True)
class Rec:
    kind: str  # "fetch" or "train"
    epoch: int
    iteration: int
    gpu: int
    values: tuple  # fetch: worker, end, start, fetch_s; train: start, time, data, throughput


def _ns(column) -> list[int]:
    return column.to_numpy().astype("datetime64[ns]").astype(np.int64).tolist()


def records_by_line(parsed: ParsedRun, files: tuple[Path, ...]) -> dict[tuple[str, int], Rec]:
    """(file name, line) -> the record the parse kept from that line."""
    out = {}
    fetch, train = parsed.tables.fetch, parsed.tables.train
    f_file, f_line = parsed.lines["fetch"]
    values = zip(
        fetch["worker"].to_pylist(), _ns(fetch["end"]), _ns(fetch["start"]),
        fetch["fetch_s"].to_pylist(), strict=True,
    )  # fmt: skip
    keys = zip(*(fetch[c].to_pylist() for c in ("epoch", "iteration", "gpu")), strict=True)
    for f, line, (e, i, g), v in zip(f_file, f_line, keys, values, strict=True):
        out[(files[f].name, int(line))] = Rec("fetch", e, i, g, v)
    t_file, t_line = parsed.lines["train"]
    values = zip(
        _ns(train["start"]), train["iteration_s"].to_pylist(), train["stall_s"].to_pylist(),
        train["throughput"].to_pylist(), strict=True,
    )  # fmt: skip
    keys = zip(*(train[c].to_pylist() for c in ("epoch", "iteration", "gpu")), strict=True)
    for f, line, (e, i, g), v in zip(t_file, t_line, keys, values, strict=True):
        out[(files[f].name, int(line))] = Rec("train", e, i, g, v)
    return out


def parse_dir(directory: Path) -> tuple[ParsedRun, tuple[Path, ...]]:
    files = tuple(sorted(directory.glob("*.log")))
    return parse_run(RunSource("run", files), keep_lines=True, max_line=LINE_LIMIT), files


def first_long_line(directory: Path, physical: dict[str, list[Piece]]) -> str | None:
    """Where the parse must stop: ``FILE:LINE: line longer than N bytes`` of the first line
    over ``LINE_LIMIT`` in read order (files sorted, as ``parse_dir`` reads them), or None."""
    for name in sorted(physical):
        for number, piece in enumerate(physical[name], 1):
            if len(piece.text) > LINE_LIMIT:
                return f"{directory / name}:{number}: line longer than {LINE_LIMIT} bytes"
    return None


def _alone(texts: list[bytes], name: str, single_file: bool) -> list[tuple | None]:
    """The record each line (no line end in it) gives on its own: ("fetch", gpu, worker, idx)
    or ("train", gpu, epoch, iteration), or None. Only what the grammar decides (a line at a
    time: its rules look at no other line), for all of a file's lines in one ``parse_lines``
    call -- one call per line cost ~10 ms of fixed Arrow work, a third of the fuzzer's time."""
    if not texts:
        return []
    block = b"".join(text + b"\n" for text in texts)
    records = grammar.parse_lines(grammar.lines_of(block), 0, grammar.Rejects())
    default = rank_from_file_name(Path(name))
    if default is None and single_file:
        default = 0
    found: list[tuple | None] = [None] * len(texts)
    for kind, part in (("fetch", records.fetch), ("train", records.train)):
        for j, line in enumerate(part["line"].tolist()):
            if found[line] is not None:  # a line's fetch record first, as one at a time
                continue
            gpu = int(part["gpu"][j])
            if gpu < 0:
                if default is None:
                    continue
                gpu = default
            if kind == "fetch":
                found[line] = ("fetch", gpu, int(part["worker"][j]), int(part["idx"][j]))
            else:
                found[line] = ("train", gpu, int(part["epoch"][j]), int(part["iteration"][j]))
    return found


# -- the oracle ------------------------------------------------------------------------------


class Original:
    """The parse of the unmutated log, indexed for the oracle."""

    def __init__(self, directory: Path):
        parsed, files = parse_dir(directory)
        assert parsed.rejects.num_rows == 0, parsed.rejects.slice(0, 3).to_pylist()
        self.by_line = records_by_line(parsed, files)
        self.single_file = len(files) == 1
        epochs = sorted({r.epoch for r in self.by_line.values()})
        self.epochs = range(epochs[0] - 1, epochs[-1] + 2)
        fetch_groups: dict[tuple, list] = {}
        train_groups: dict[int, list] = {}
        for (name, line), r in self.by_line.items():
            if r.kind == "fetch":
                fetch_groups.setdefault((name, r.gpu, r.values[0]), []).append((line, r))
            else:
                train_groups.setdefault(r.gpu, []).append(((r.epoch, r.iteration), r))
        self.fetch_groups = {k: sorted(v, key=lambda x: x[0]) for k, v in fetch_groups.items()}
        self.train_groups = {k: sorted(v, key=lambda x: x[0]) for k, v in train_groups.items()}
        # the records per iteration, built once: every case compares its mutant's with them
        self.by_iteration = by_iteration(self.by_line.values())

    def _near(self, group: list, position) -> set[tuple[int, int]]:
        keys = [k for k, _ in group]
        at = _bisect(keys, position)
        return {(r.epoch, r.iteration) for _, r in group[max(0, at - K) : at + K + 1]}

    def touched(self, mutant: Mutant, physical: dict[str, list[Piece]]) -> set[tuple[int, int]]:
        touched: set[tuple[int, int]] = set()
        for name, origin in mutant.dropped:
            if (r := self.by_line.get((name, origin + 1))) is not None:
                touched.add((r.epoch, r.iteration))
        for name, rows in physical.items():
            edited = []  # (piece, the origin of the last original line at or before it)
            last_origin = 0
            for piece in rows:
                if piece.origin is not None:
                    last_origin = piece.origin
                if not (piece.changed or piece.copy):
                    continue
                if piece.origin is not None and (r := self.by_line.get((name, piece.origin + 1))):
                    touched.add((r.epoch, r.iteration))
                if not piece.copy:
                    edited.append((piece, last_origin))
            alone = _alone([piece.text for piece, _ in edited], name, self.single_file)
            for (_, last_origin), new in zip(edited, alone, strict=True):
                if new is None:
                    continue
                if new[0] == "fetch":
                    _, gpu, worker, idx = new
                    touched |= {(e, idx) for e in self.epochs}
                    group = self.fetch_groups.get((name, gpu, worker), [])
                    touched |= self._near(group, last_origin + 1)
                else:
                    _, gpu, epoch, iteration = new
                    touched |= {(e, iteration) for e in (epoch - 1, epoch, epoch + 1)}
                    touched |= self._near(self.train_groups.get(gpu, []), (epoch, iteration))
        return touched


def by_iteration(records) -> dict:
    """(epoch, iteration) -> how many times each record (kind, GPU, values) occurs in it."""
    out: dict = {}
    for r in records:
        out.setdefault((r.epoch, r.iteration), Counter())[(r.kind, r.gpu, r.values)] += 1
    return out


def _bisect(keys: list, position) -> int:
    lo, hi = 0, len(keys)
    while lo < hi:
        mid = (lo + hi) // 2
        if keys[mid] < position:
            lo = mid + 1
        else:
            hi = mid
    return lo


def check(original: Original, mutant: Mutant, directory: Path) -> dict:
    """Parse the mutant written to ``directory`` and assert (b) and (c); returns counts."""
    physical = mutant.write(directory)
    why = "; ".join(mutant.edits)
    too_long = first_long_line(directory, physical)
    try:
        parsed, files = parse_dir(directory)
    except InputError as exc:  # only when nothing usable is left, or a line is too long
        if too_long is not None:  # (a binary file's description may follow)
            assert str(exc).startswith(too_long), (str(exc), too_long, why)
            return {"error": 1, "too long": 1}
        assert "no fetch or training records" in str(exc) or "compressed" in str(exc), (exc, why)
        return {"error": 1}
    assert too_long is None, (f"parsed despite {too_long}", why)
    got = records_by_line(parsed, files)
    touched = original.touched(mutant, physical)

    for (name, line), rec in got.items():  # (b)
        piece = physical[name][line - 1]
        if piece.changed:
            continue
        assert piece.origin is not None, (name, line, why)
        want = original.by_line.get((name, piece.origin + 1))
        assert want is not None, (f"{name}:{line} was not a record", rec, why)
        same = (want.kind, want.iteration, want.gpu, want.values)
        assert (rec.kind, rec.iteration, rec.gpu, rec.values) == same, (rec, want, why)
        moved = rec.epoch != want.epoch
        assert not moved or {(rec.epoch, rec.iteration), (want.epoch, want.iteration)} <= touched, (
            f"{name}:{line} moved from epoch {want.epoch} to {rec.epoch}",
            why,
        )

    before, after = original.by_iteration, by_iteration(got.values())
    for key in before.keys() | after.keys():  # (c)
        if key not in touched:
            assert before.get(key) == after.get(key), (
                f"untouched iteration {key} changed",
                sorted(before.get(key, {}).items()),
                sorted(after.get(key, {}).items()),
                why,
            )
    return {"touched": len(touched), "iterations": len(before), "rejected": parsed.rejects.num_rows}


# -- profiler traces: nesting and string sizes about the bounds ----------------------------


def nested_trace(rng: random.Random, max_depth: int, max_string: int) -> tuple[bytes, str | None]:
    """A one-rank profiler trace whose events carry ``args`` nested about ``max_depth`` deep
    and names about ``max_string`` bytes long (escapes, quotes and brackets inside), and the
    error it must give: ``"nested deeper"`` or ``"string longer"``, whichever comes first in
    the text, or None (it parses, with ``steps`` profiler steps)."""
    events: list[tuple[bytes, str | None]] = []
    for step in range(rng.randint(1, 4)):
        ts = 1000 * step
        events.append(
            (b'{"ph": "X", "name": "ProfilerStep#%d", "ts": %d, "dur": 900}' % (step, ts), None)
        )
        loader = b'{"ph": "X", "name": "enumerate(DataLoader)#_x.__next__", "ts": %d, "dur": 5}'
        events.append((loader % ts, None))
    for _ in range(rng.randint(0, 4)):
        depth = rng.choice([max_depth - 4, max_depth - 3, max_depth - 2, 10 * max_depth, 2])
        size = rng.choice([max_string, max_string + 1, max_string - 1, 5, 3 * max_string])
        raw = bytes(rng.choice(b'ab\\"{[') for _ in range(size))
        name = _escaped(raw)[:size].rstrip(b"\\")  # whole escapes only: still valid JSON
        nest, close = rng.choice([(b"[", b"]"), (b'{"k": ', b"}")])
        body = b'{"ph": "i", "name": "%s", "args": %s0%s}' % (name, nest * depth, close * depth)
        # the document, traceEvents and the event are 3 levels; the name comes before args
        error = "string longer" if len(name) > max_string else None
        error = error or ("nested deeper" if depth + 3 > max_depth else None)
        events.insert(rng.randint(0, len(events)), (body, error))
    text = b'{"distributedInfo": {"rank": 0}, "traceEvents": ['
    text += b", ".join(e for e, _ in events) + b"]}"
    return text, next((error for _, error in events if error), None)


def _escaped(raw: bytes) -> bytes:
    return raw.replace(b"\\", b"\\\\").replace(b'"', b'\\"')
