"""``envs=`` (E2B's spelling) through every Python door: a local Sandbox's
runs spawned and pooled, its sessions started and claimed from the pool,
a RemoteSandbox's runs and sessions; a run's or cell's own variables win
and a cell's go back when it ends; a name the jail keeps is refused with
the caller's exception, naming it, and nothing runs."""

from __future__ import annotations

import pytest
from conftest import TOKEN

from jail_sandbox import RemoteError, RemoteSandbox, Sandbox, SandboxSetupError

SHOW = "import os\nprint(os.environ.get('A'), os.environ.get('S'), os.environ.get('C'))"


@pytest.mark.parametrize("pool", [0, 1])
def test_a_local_sandboxs_variables_reach_runs_and_sessions_spawned_or_pooled(rootfs, pool):
    with Sandbox(rootfs=rootfs, pool=pool, envs={"A": "sandbox", "S": "sandbox"}) as sb:
        ex = sb.run(SHOW, envs={"A": "run"})
        assert (ex.stdout, ex.backend) == ("run sandbox None\n", "pool" if pool else "run")
        with pytest.raises(SandboxSetupError, match="LD_PRELOAD"):
            sb.run("open('/workspace/output/ran', 'w')", envs={"LD_PRELOAD": "/x.so"})
        with sb.session(envs={"S": "session"}) as s:
            assert s.backend == ("pool" if pool else "start")
            assert s.run(SHOW, envs={"C": "cell"}).stdout == "sandbox session cell\n"
            assert s.run(SHOW).stdout == "sandbox session None\n", "a cell's variable outlived it"
            with pytest.raises(SandboxSetupError, match="PYTHONPATH"):
                s.run("print(1)", envs={"PYTHONPATH": "/x"})
            assert s.run("print(2)").stdout == "2\n", "the session lives on after a refused cell"
    with pytest.raises(TypeError, match="str"):
        Sandbox(rootfs=rootfs, envs={"A": 1})  # type: ignore[dict-item]


def test_a_remote_sandboxs_variables_reach_runs_and_sessions_and_a_bad_name_is_400(server):
    remote = RemoteSandbox(server.url, TOKEN, envs={"A": "sandbox"})
    assert remote.run(SHOW, envs={"C": "run"}).stdout == "sandbox None run\n"
    with remote.session(envs={"S": "session"}) as s:
        assert s.run(SHOW, envs={"C": "cell"}).stdout == "sandbox session cell\n"
        assert s.run(SHOW).stdout == "sandbox session None\n"
        with pytest.raises(RemoteError) as e:
            s.run("print(1)", envs={"JAIL_PRELOAD": "os"})
        assert (e.value.status, e.value.field) == (400, "env") and "JAIL_PRELOAD" in str(e.value)
    with pytest.raises(RemoteError) as e:
        remote.run("print(1)", envs={"HTTPS_PROXY": "http://evil"})
    assert (e.value.status, e.value.field) == (400, "env")


def test_the_async_clients_are_the_same_calls_as_coroutines(rootfs, server):
    import asyncio

    from jail_sandbox import AsyncRemoteSandbox, AsyncSandbox

    async def main() -> None:
        async with AsyncSandbox(rootfs=rootfs, pool=0, envs={"A": "async"}) as sandbox:
            # Two runs at once: the loop is never blocked on a jail.
            a, b = await asyncio.gather(sandbox.run_code(SHOW), sandbox.run_code("print(2)"))
            assert (a.stdout, b.stdout) == ("async None None\n", "2\n")
            async with await sandbox.session(envs={"S": "s"}) as s:
                await s.run_code("x = 41")
                assert (await s.run_code("print(x + 1)")).stdout == "42\n"
                assert (await s.run_code(SHOW, envs={"C": "c"})).stdout == "async s c\n"
            with pytest.raises(SandboxSetupError, match="LD_PRELOAD"):
                await sandbox.run_code("print(1)", envs={"LD_PRELOAD": "/x.so"})
        remote = AsyncRemoteSandbox(server.url, TOKEN, envs={"A": "remote"})
        assert (await remote.run_code(SHOW)).stdout == "remote None None\n"
        async with await remote.session() as s:
            assert (await s.run_code(SHOW, envs={"C": "c"})).stdout == "remote None c\n"

    asyncio.run(main())
