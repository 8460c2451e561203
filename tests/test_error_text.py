"""A row's reason from an exception: the first line, and for a message that only introduces what
follows (FlashInfer's "Ninja build failed. Ninja output:"), the lines that name the error."""
from attnbench.execute.error_text import error_text

NINJA = """Ninja build failed. Ninja output:
[1/3] c++ -MMD -c batch_prefill.cu -o batch_prefill.o
FAILED: batch_prefill.cuda.o
nvcc fatal   : Killed (signal 9)
ninja: build stopped: subcommand failed.
"""


def test_a_message_that_introduces_its_output_keeps_the_lines_naming_the_error():
    got = error_text(RuntimeError(NINJA))
    assert got.startswith("RuntimeError: Ninja build failed. Ninja output: ")
    assert "FAILED: batch_prefill.cuda.o | nvcc fatal   : Killed (signal 9) | ninja: build stopped: subcommand failed." in got
    assert "[1/3]" not in got


def test_without_an_error_word_the_last_line_follows():
    assert error_text(ValueError("the table says:\nrow 1\nrow 2 is the one")) == "ValueError: the table says: row 2 is the one"


def test_a_plain_message_keeps_its_first_line_and_the_limit():
    assert error_text(KeyError("x")) == "KeyError: 'x'"
    assert error_text(RuntimeError("first\nsecond")) == "RuntimeError: first"
    assert error_text(RuntimeError("")) == "RuntimeError"
    assert len(error_text(RuntimeError("y" * 999))) == 300 and len(error_text(RuntimeError("y" * 999), 400)) == 400
