"""A smolagents CodeAgent's executor that runs every code action in a jail,
as cells of one session (jail_sandbox.integrations.smolagents).

Give it to an agent as `CodeAgent(tools=[], model=..., executor=JailExecutor())`;
here the executor is called with code actions directly, as the agent calls
it, so the example runs without an LLM:

    pip install 'jail-sandbox[smolagents]'
    python examples/smolagents_executor.py

State carries from one action to the next (a variable, an import, a
function), variables sent with `send_variables` are there, `final_answer`
ends with a value, and an action that raises raises JailExecutionError
with its logs. `make test-python` runs this file.
"""

from jail_sandbox import Sandbox
from jail_sandbox.integrations.smolagents import JailExecutionError, JailExecutor

executor = JailExecutor(Sandbox(timeout=30))
try:
    executor.send_tools({})
    executor.send_variables({"prices": [3.5, 4.25, 10.0]})
    step = executor("total = sum(prices)\nprint('adding', len(prices), 'prices')")
    print(step)
    assert (step.logs, step.is_final_answer) == ("adding 3 prices\n", False), step
    # The next action sees `total` from the last one: one session.
    step = executor("def with_tax(x):\n    return round(x * 1.2, 2)\nwith_tax(total)")
    print(step)
    assert step.output == 21.3, step
    done = executor("final_answer({'total': total, 'with_tax': with_tax(total)})")
    print(done)
    assert done.is_final_answer and done.output == {"total": 17.75, "with_tax": 21.3}, done
    try:
        executor("1 / 0")
    except JailExecutionError as e:
        print("raised:", str(e).splitlines()[0])
        assert str(e).startswith("ZeroDivisionError")
    else:
        raise AssertionError("an error in the action must raise")
finally:
    executor.cleanup()
