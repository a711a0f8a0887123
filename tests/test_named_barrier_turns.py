"""E-SYN-02 on named barriers shared by warp sets of one role (warpgroups taking turns, tasks/kmeans/wide_pingpong.py):
disjoint sets meet in one instance, so their threads add up; a set alone, or overlapping sets, count alone."""
from cake_ir.builder import KernelBuilder
from cake_ir.verifier import verify


def _turns(threads: int, arrive_cond: str = "wg == 1"):
    kb = KernelBuilder("turns", arch="sm_90a", grid=[1], threads=256)
    kb.named_barrier("turn", 1, threads)
    with kb.role("main", warps=(0, 8)) as r:
        with r.if_("wg == 0"):
            r.add("bar_sync", barrier="turn")
        with r.if_(arrive_cond):
            r.add("bar_arrive", barrier="turn")
    return kb.build()


def _codes(k):
    return [d.code for d in verify(k).diagnostics if d.severity == "error"]


def test_disjoint_warpgroups_meet_in_one_instance():
    assert "E-SYN-02" not in _codes(_turns(256))


def test_disjoint_warpgroups_with_the_wrong_count_are_reported():
    diags = [d for d in verify(_turns(384)).diagnostics if d.code == "E-SYN-02"]
    assert diags and diags[0].legal == 256


def test_overlapping_warp_sets_count_alone():
    # both sites reached by warpgroup 0: two separate instances of 128 threads each, not one of 256
    assert "E-SYN-02" in _codes(_turns(256, arrive_cond="wg == 0"))
