"""docs/client.md's Python section as a new user runs it: the install block (the build's wheel
into a fresh venv with pip; `build` is this build folder) and then every Python example marked
`<!-- example -->`, each run as a script by that venv's python against a CPU drafthead-server (the
examples' 127.0.0.1:50051 replaced by its address); the examples also pass `mypy --strict` against
the installed package. No PYTHONPATH. About 30 s."""

import os
import re
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from client_test_util import BIN, RealServerTestCase  # noqa: E402

DOC = os.path.join(os.environ.get("DRAFTHEAD_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..")),
                   "docs", "client.md")
# <!-- example --> or <!-- example: NAME --> on the line before a fenced block.
BLOCK = re.compile(r"<!-- example(?:: (\w+))? -->\n```(\w+)\n(.*?)```", re.S)


def examples():
    with open(DOC) as f:
        return [(name or "", lang, code) for name, lang, code in BLOCK.findall(f.read())]


class DocsExamplesTest(RealServerTestCase):
    SERVER_ARGS = ["--synthetic=3", "--hidden-size=64", "--padded-vocab=1024", "--tp=1", "--threads=1"]

    def test_install_then_every_example(self):
        blocks = examples()
        install = [code for name, lang, code in blocks if name == "install"]
        python = [code for name, lang, code in blocks if lang == "python"]
        self.assertEqual(len(install), 1)
        self.assertGreaterEqual(len(python), 2)
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        with tempfile.TemporaryDirectory(prefix="dh-docs-") as work:
            os.symlink(os.path.abspath(BIN), os.path.join(work, "build"))
            # `python3` is the system's (CMake's DRAFTHEAD_PYTHON, /usr/bin/python3 on Debian), as on
            # a fresh machine, even where another python3 comes first on PATH (pyenv).
            os.mkdir(os.path.join(work, ".bin"))
            os.symlink(os.environ.get("DRAFTHEAD_PYTHON", "/usr/bin/python3"), os.path.join(work, ".bin", "python3"))
            env["PATH"] = os.path.join(work, ".bin") + os.pathsep + env.get("PATH", "")
            p = subprocess.run(["bash", "-euo", "pipefail", "-c", install[0]], cwd=work, env=env, capture_output=True,
                               text=True, timeout=600)
            self.assertEqual(p.returncode, 0, f"install block failed:\n{p.stdout}\n{p.stderr}")
            venvs = [d for d in os.listdir(work) if os.path.exists(os.path.join(work, d, "bin", "python"))]
            self.assertEqual(len(venvs), 1, venvs)
            py = os.path.join(work, venvs[0], "bin", "python")
            files = []
            for i, code in enumerate(python):
                self.assertIn("127.0.0.1:50051", code)
                p = subprocess.run([py, "-c", code.replace("127.0.0.1:50051", self.target)], cwd=work, env=env,
                                   capture_output=True, text=True, timeout=120)
                self.assertEqual(p.returncode, 0, f"example {i + 1} failed:\n{code}\n{p.stdout}\n{p.stderr}")
                files.append(os.path.join(work, f"example{i + 1}.py"))
                with open(files[-1], "w") as f:
                    f.write(code)
            # A user's code type-checks against the installed package (py.typed, the stubs' .pyi).
            p = subprocess.run([os.environ.get("DRAFTHEAD_PYTHON", "/usr/bin/python3"), "-m", "mypy", "--strict",
                                "--no-incremental", "--python-executable", py] + files, cwd=work, env=env,
                               capture_output=True, text=True, timeout=300)
            self.assertEqual(p.returncode, 0, f"mypy --strict on the examples:\n{p.stdout}\n{p.stderr}")


if __name__ == "__main__":
    unittest.main(verbosity=2)
