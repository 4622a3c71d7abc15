"""The victim rule and the per-backend preemption cap."""

from __future__ import annotations

from fairq_server.config.preempt import PreemptConfig
from fairq_server.scheduling.victims import (
    RateCap,
    Running,
    Waiting,
    choose_victim,
    eligible,
    slot_frees_soon,
)

CFG = PreemptConfig(min_tokens=4, max_per_request=2, max_per_second=2)


def run(key: str, **kw: object) -> Running:
    values: dict[str, object] = {
        "tier": 0, "standing": 4.0, "step": 1.0, "generated": 10, "remaining": 100,
        "preemptions": 0, "seq": 0,
    }  # fmt: skip
    values.update(kw)
    return Running(key=key, **values)  # type: ignore[arg-type]


def test_lowest_tier_goes_first_whatever_the_standing() -> None:
    victims = [run("t1", tier=1, standing=1.0), run("t2", tier=2, standing=1.0), run("t0")]
    chosen = choose_victim(Waiting(tier=0, standing=0.0), victims, CFG)
    assert chosen is not None and chosen.key == "t2"


def test_then_the_user_furthest_above_its_share_then_fewest_tokens_left() -> None:
    victims = [
        run("a-near-end", standing=3.0, generated=250, remaining=50),
        run("b-fresh", standing=5.0, generated=20, remaining=280),
        run("b-near-end", standing=5.0, generated=200, remaining=100),
    ]
    chosen = choose_victim(Waiting(tier=0, standing=0.0), victims, CFG)
    # Its slot frees soonest: the preempting request's run lands on the slot that is furthest
    # ahead, not on one that a previous light run already put behind.
    assert chosen is not None and chosen.key == "b-near-end"


def test_a_bounded_request_goes_before_an_unbounded_one_then_the_one_generated_most() -> None:
    victims = [
        run("open-young", remaining=None, generated=20),
        run("open-old", remaining=None, generated=90),
        run("bounded", remaining=400, generated=10),
    ]
    chosen = choose_victim(Waiting(tier=0, standing=0.0), victims, CFG)
    assert chosen is not None and chosen.key == "bounded"
    chosen = choose_victim(Waiting(tier=0, standing=0.0), victims[:2], CFG)
    assert chosen is not None and chosen.key == "open-old"


def test_then_the_request_preempted_least_though_it_has_generated_more() -> None:
    # A request preempted once has paused for a light run already: even with the fewest
    # tokens left it is not paused again while an untouched request may be.
    victims = [
        run("resumed", standing=5.0, generated=30, remaining=50, preemptions=1),
        run("untouched", standing=5.0, generated=45, remaining=60),
        run("other-user", standing=3.0, generated=5),
    ]
    chosen = choose_victim(Waiting(tier=0, standing=0.0), victims, CFG)
    assert chosen is not None and chosen.key == "untouched"


def test_a_slot_frees_soon_when_a_request_has_min_tokens_or_fewer_left() -> None:
    assert slot_frees_soon([run("a", remaining=100), run("b", remaining=4)], CFG)
    assert not slot_frees_soon([run("a", remaining=100), run("b", remaining=5)], CFG)
    # No bound known (no max_tokens): it may run on for ever.
    assert not slot_frees_soon([run("a", remaining=None)], CFG)
    assert not slot_frees_soon([], CFG)


def test_same_tier_only_if_the_swap_keeps_the_order() -> None:
    # After the swap the victim's user holds 1, the waiting user 1: no reversal, allowed.
    assert eligible(run("v", standing=2.0), Waiting(tier=0, standing=0.0), CFG)
    # The victim's user would drop below the waiting user's: never (that is ping-pong).
    assert not eligible(run("v", standing=1.0), Waiting(tier=0, standing=0.0), CFG)
    assert not eligible(run("v", standing=2.0), Waiting(tier=0, standing=1.0), CFG)
    # A higher tier than the waiting request is never a victim.
    assert not eligible(run("v", tier=0, standing=9.0), Waiting(tier=1, standing=0.0), CFG)


def test_weights_scale_the_step() -> None:
    # A user of weight 4 holding 2 requests stands at 0.5; one fewer takes 0.25.
    heavy = run("v", standing=0.5, step=0.25)
    assert not eligible(heavy, Waiting(tier=0, standing=0.0, step=1.0), CFG)
    assert eligible(heavy, Waiting(tier=0, standing=0.0, step=0.25), CFG)


def test_anti_thrash_bounds() -> None:
    w = Waiting(tier=0, standing=0.0)
    assert not eligible(run("v", generated=3), w, CFG)  # within its first K tokens
    assert eligible(run("v", generated=4), w, CFG)
    # Counted in the current attempt: resumed with 40 tokens, it has decoded 3 since.
    assert not eligible(run("v", generated=43, carried=40), w, CFG)
    assert eligible(run("v", generated=44, carried=40), w, CFG)
    assert not eligible(run("v", preemptions=2), w, CFG)  # at most M per request
    assert not eligible(run("v", remaining=4), w, CFG)  # about to finish
    assert eligible(run("v", remaining=None), w, CFG)
    assert not eligible(run("v", exempt=True), w, CFG)
    assert choose_victim(w, [run("v", exempt=True)], CFG) is None


def test_rate_cap_per_second_window() -> None:
    cap = RateCap(2)
    assert cap.allows(10.0)
    cap.record(10.0)
    cap.record(10.5)
    assert not cap.allows(10.9)
    assert cap.allows(11.0)  # the first one left the window
    cap.record(11.0)
    assert not cap.allows(11.4)
