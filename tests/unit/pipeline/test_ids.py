"""Operation IDs: :func:`pipeline.ids.op_step` reads back the step :func:`pipeline.ids.op_id` put in."""

from __future__ import annotations

from pipeline.ids import op_id, op_step, workflow_id_for


def test_the_step_of_an_operation_id_is_what_op_id_put_in_and_nothing_of_another_run() -> None:
    wf = workflow_id_for("acme/cart", 7)
    assert op_step(op_id(wf, "env-base", 1), wf) == "env-base"
    assert op_step(op_id(wf, "baseline"), wf) == "baseline"
    other = workflow_id_for("acme/cart", 70)
    assert op_step(op_id(other, "baseline"), wf) is None
    assert op_step(wf, wf) is None
    assert op_step(f"{wf}:", wf) is None
