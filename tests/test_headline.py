"""`dsim run`'s headline: the pipeline model's verdict first, the original's number below."""

from __future__ import annotations

from pathlib import Path

import dsim
from dsim.app.headline import headlines, pipeline_verdict
from dsim.synth import SynthParams, synthesize


def test_headline_is_the_pipeline_runs_own_verdict(tmp_path: Path) -> None:
    logs = synthesize(
        SynthParams(gpus=3, iterations=50, epochs=2, workers=2, seed=2, skew=0.5), tmp_path / "l"
    )
    trace = dsim.parse(logs, out=tmp_path / "traces")
    original = dsim.run(trace, out=tmp_path / "a", executor="local")
    piped = dsim.run(trace, out=tmp_path / "b", executor="local", model="pipeline")
    [v] = original.verdicts
    infos = {str(r.directory): r.info for r in original.runs}
    found = headlines(original.summary, original.verdicts, trace.directory.parent, infos)
    assert list(found) == [v.results]
    # The same numbers as `dsim run --model pipeline` on the same policies and selection.
    assert found[v.results].text == piped.verdicts[0].text
    assert "(pipeline replay model; fetch durations assumed independent" in found[v.results].text
    assert v.text.endswith("(per-iteration replay model)")  # the verdict itself is unchanged
    rows = original.summary.to_dict("records")
    assert pipeline_verdict(rows, tmp_path / "missing", None) is None  # no trace: no headline
