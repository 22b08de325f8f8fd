"""`pip install ./python` as the README says: into a venv made with
--system-site-packages (Debian's cffi and numpy), offline (Debian's
setuptools builds it); the installed package, imported from elsewhere,
finds libpeclient.so.0 in the build tree and talks to a daemon."""
import os
import subprocess
import sys

from helpers import BUILD, SOURCE


def test_pip_install_into_a_venv(tmp_path, daemon):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)],
                   check=True, timeout=120)
    py = venv / "bin" / "python"
    p = subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                        "--no-index", str(SOURCE / "python")],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(PE_BUILD_DIR=str(BUILD), PE_SOCKET=daemon.address)
    code = ("import peclient as pe\n"
            "print(pe.__file__)\n"
            "with pe.Client() as c:\n"
            "    c.ping()\n"
            "    print('ping ok', c.status()['version'])\n")
    p = subprocess.run([str(py), "-c", code], cwd=str(tmp_path), env=env, capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr
    path, ping = p.stdout.splitlines()[:2]
    assert path.startswith(str(venv)), path  # the installed copy, not the checkout's
    assert ping.startswith("ping ok"), p.stdout
