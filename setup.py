"""Builds accyd's native launch engine, a C extension that is optional: accyd runs without it.

Where it cannot be built (no compiler, no Python headers) the build goes on without it
and the daemon's Python ring loop serves. ``ACCYD_NATIVE=0`` skips it;
``ACCYD_NATIVE=sanitize`` builds it with AddressSanitizer and UndefinedBehaviorSanitizer,
``ACCYD_NATIVE=thread`` with ThreadSanitizer (run such a build with the sanitizer's runtime
preloaded: ``scripts/sanitize_engine.sh``).
"""

import os

from setuptools import Extension, setup

mode = os.environ.get("ACCYD_NATIVE", "1")
flags = ["-O2", "-std=gnu11", "-Wall", "-Wextra", "-Werror=implicit-function-declaration"]
link: list[str] = []
if mode == "sanitize":
    sanitizers = ["-fsanitize=address,undefined", "-fno-omit-frame-pointer", "-fno-sanitize-recover=undefined"]
    flags = ["-O1", "-g", "-std=gnu11", "-Wall", "-Wextra", *sanitizers]
    link = sanitizers
elif mode == "thread":
    flags = ["-O1", "-g", "-std=gnu11", "-Wall", "-Wextra", "-fsanitize=thread"]
    link = ["-fsanitize=thread"]

native = Extension(
    "accyd.ring.engine._native",
    ["server/accyd/ring/engine/_native.c"],
    extra_compile_args=flags,
    extra_link_args=link,
    libraries=["dl", "pthread"],
    optional=mode not in ("sanitize", "thread"),  # a sanitizer build that fails must say so
)

setup(ext_modules=[] if mode == "0" else [native])
