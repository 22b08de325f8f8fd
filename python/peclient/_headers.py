"""cffi declarations from libpeclient's public headers (client/include/).

cffi's ABI mode takes C declarations but no preprocessor: this keeps the
headers' declarations and their integer #defines, and leaves out comments,
include guards, the C++ blocks and the function-like macros. It runs on
the source tree's headers when peclient is imported from a checkout, and
at install (setup.py), where its result is stored as peclient/_cdef.py.
Reads files only: no libpeclient needed.
"""
import re
from pathlib import Path

# Each header after those it uses; others follow in name order.
ORDER = ["peclient_version.h", "pe_builder.h", "pe_client.h", "pe_dataset.h", "pe_feed_data.h",
         "pe_batch_prefetch.h", "pe_models.h", "pe_recipe.h", "pe_model_file.h"]


def declarations(text):
    """One header's declarations for cffi."""
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    text = re.sub(r"//[^\n]*", "", text)
    text = re.sub(r"\\\n", " ", text)  # a macro's continued lines are one line
    out, depth, skipping = [], 0, 0
    for line in text.split("\n"):
        s = line.strip()
        if s.startswith("#if"):
            depth += 1
            if skipping or s == "#ifdef __cplusplus":
                skipping += 1
            continue
        if s.startswith("#endif"):
            depth -= 1
            if skipping:
                skipping -= 1
            continue
        if skipping:
            continue
        if s.startswith("#"):
            if re.fullmatch(r"#define \w+ \d+", s):
                out.append(s)
            continue
        if s:
            out.append(line.rstrip())
    return "\n".join(out)


def cdef(include_dir):
    """The declarations of every header in include_dir."""
    d = Path(include_dir)
    names = sorted(p.name for p in d.glob("*.h"))
    if not names:
        raise FileNotFoundError("%s: no headers" % d)
    names = [n for n in ORDER if n in names] + [n for n in names if n not in ORDER]
    return "\n".join(declarations((d / n).read_text()) for n in names)
