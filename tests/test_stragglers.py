"""Which rank is named a straggler from the ring probe's and the busy times' numbers
(bigbatch.stragglers). The real thing — one namespace node's link shaped to a tenth — is the
straggler row of tests/test_cluster.py."""

from __future__ import annotations

from bigbatch.distributed import DistContext
from bigbatch.stragglers import Named, StragglerWatch, link_scores, outliers


def test_the_rank_with_the_slow_link_is_the_one_in_two_slow_transfers():
    # rank 2's link is slow: the transfer it receives (from 1) and the one it sends (to 0) are
    receive = [0.090, 0.009, 0.088]  # rank 0 receives from 2, rank 1 from 0, rank 2 from 1
    assert outliers(link_scores(receive)) == [2]
    receive = [0.010, 0.100, 0.011, 0.100]  # four ranks, rank 1's link slow (recv 1, recv 2)
    assert link_scores(receive)[1] == 0.011 and outliers(link_scores([0.01, 0.1, 0.1, 0.01])) == [1]


def test_two_ranks_share_one_path_and_no_link_is_blamed():
    assert outliers(link_scores([0.5, 0.01])) == []


def test_a_machine_busy_far_longer_than_the_others_is_named_and_close_ones_are_not():
    assert outliers([1.0, 1.1, 4.0]) == [2]
    assert outliers([1.0, 1.1, 2.5]) == []


def test_names_are_counted_and_summarised_most_often_first():
    ctx = DistContext(0, 3, 0, "gloo", "cpu")
    watch = StragglerWatch(ctx, 4, ["a", "b", "c"])
    for _ in range(2):
        watch.note(Named(2, "c", "link", 0.09, 0.009))
    watch.note(Named(1, "b", "compute", 3.0, 1.0))
    summary = watch.summary()
    assert [(s["rank"], s["kind"], s["times"]) for s in summary] == [(2, "link", 2),
                                                                     (1, "compute", 1)]
    assert "10.0x the others'" in Named(2, "c", "link", 0.09, 0.009).describe()
