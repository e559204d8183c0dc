"""Stop strings over text that arrives in pieces."""

from __future__ import annotations

from service.frontend.stop_checker import StopChecker


def feed(checker: StopChecker, pieces: list[str]) -> tuple[str, str | None]:
    released = []
    for piece in pieces:
        check = checker.update(piece)
        released.append(check.text)
        if check.stop_str is not None:
            return "".join(released), check.stop_str
    return "".join(released) + checker.flush(), None


def test_no_stop_strings_pass_text_through() -> None:
    assert feed(StopChecker([]), ["a", "b"]) == ("ab", None)


def test_stop_string_spanning_pieces_is_cut() -> None:
    assert feed(StopChecker(["STOP"]), ["Hello S", "T", "OP and more"]) == ("Hello ", "STOP")


def test_stop_string_kept_when_asked() -> None:
    assert feed(StopChecker(["STOP"], include_stop_str_in_output=True), ["Hi ST", "OP!"]) == ("Hi STOP", "STOP")


def test_possible_start_is_held_back_then_released() -> None:
    checker = StopChecker(["END"])
    assert checker.update("abc E").text == "abc "
    assert checker.update("N").text == ""
    assert checker.update("x").text == "ENx"


def test_held_text_is_flushed_when_the_request_ends() -> None:
    assert feed(StopChecker(["END"]), ["abc EN"]) == ("abc EN", None)


def test_earliest_of_several_stop_strings_wins() -> None:
    assert feed(StopChecker(["cd", "b"]), ["abcd"]) == ("a", "b")
