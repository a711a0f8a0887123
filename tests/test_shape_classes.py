"""Shape classes: a run times one bench shape and tests candidates on the test shapes of that shape's
class (tasks.base.BaseTask.shape_class_keys; kda: the gate form), and seeds whose scalar facts refuse the
class are left out, so a kernel specialised to one gate form (the chunked KDA prefills) competes where
it applies."""
import pytest

from tasks.registry import get, select_shape


def test_kda_runs_are_per_gate_form():
    e = get("kda")
    assert e.bench_shape["SAFE"] == 1                       # the task's first bench shape
    assert e.test_shapes() and all(s["SAFE"] == 1 for s in e.test_shapes())
    assert e.timed_shapes()[0] == e.bench_shape and all(s["SAFE"] == 1 for s in e.timed_shapes())
    assert [g["name"] for g in e.seed_genomes()] == ["kda_recurrent_sm80", "kda_chunked_safe_sm90a",
                                                     "kda_two_pass_safe_sm90a"]
    soft = e.for_shape("SAFE=0")
    assert soft.bench_shape["SAFE"] == 0 and all(s["SAFE"] == 0 for s in soft.test_shapes())
    assert [g["name"] for g in soft.seed_genomes()] == ["kda_recurrent_sm80", "kda_chunked_softplus_sm90a",
                                                        "kda_two_pass_softplus_sm90a"]
    # every test shape is in exactly one class: the two runs together test the whole matrix
    assert len(e.test_shapes()) + len(soft.test_shapes()) == len(e.task.shapes)
    assert "SAFE = 0 < min 1" in soft.refusal(e.seeds()["kda_chunked_safe_sm90a"])
    assert e.refusal(e.seeds()["kda_chunked_safe_sm90a"]) is None
    # a Program's facts are its kernels' (the two-pass prefill)
    assert "SAFE = 1 > max 0" in e.refusal(e.seeds()["kda_two_pass_softplus_sm90a"])


def test_tasks_without_classes_test_every_shape():
    e = get("gemm")
    assert e.test_shapes() == [dict(s) for s in e.task.shapes]
    assert e.for_shape("0").bench_shape == e.bench_shape


@pytest.mark.parametrize("sel, msg", [("SAFE=3", "values there: {'SAFE': [0, 1]}"), ("FOO=1", "unknown shape keys"),
                                      ("x", "is not KEY=INTEGER"), ("99", "out of range")])
def test_bad_selectors_name_the_legal_values(sel, msg):
    with pytest.raises(ValueError, match=msg.replace("[", r"\[").replace("{", r"\{")):
        get("kda").for_shape(sel)


def test_select_shape_by_index_and_keys():
    shapes = [{"A": 1, "B": 2}, {"A": 1, "B": 3}]
    assert select_shape(shapes, "1") == shapes[1]
    assert select_shape(shapes, "A=1,B=3") == shapes[1]
    assert select_shape(shapes, "A=1") == shapes[0]


def test_cli_refuses_a_bad_shape(capsys):
    from agent.run import main
    assert main(["--task", "kda", "--dry-run", "--shape", "SAFE=7"]) == 2
    assert "--shape" in capsys.readouterr().err
