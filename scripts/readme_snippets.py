#!/usr/bin/env python3
"""Checks, or writes, the code the READMEs show or point at: each is cut from its source.

Usage: scripts/readme_snippets.py              check: exit 1, naming each stale block
       scripts/readme_snippets.py --write      rewrite every block from its source
       scripts/readme_snippets.py --self-test  the check on a tree of its own, with the
                                               mistakes it must catch

In the source, the lines between two marker comments are the snippet NAME:

    // snippet: NAME
    ...the code the README shows...
    // snippet end: NAME

(`#` instead of `//` in a script). In a README, the comment line

    <!-- snippet: PATH NAME -->

comes right before a fenced code block, which must hold those lines, less their common
indentation. A link to the lines instead of the code (a chapter's "Read the code") is
written before a comment that names them:

    [`PATH:FIRST-LAST`](RELATIVE-PATH#LFIRST-LLAST) <!-- code: PATH NAME -->

and must give the snippet's first and last line. A source edited without its README (a
line added above a snippet moves it), a marker missing or named twice, or a README pointing
at nothing fails the check (CTest readme_snippets_current, so scripts/test.sh and CI run
it); --write copies every block and link from its source. Every tracked README.md and
docs/*.md is read. Only the standard library is needed.
"""
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
REFERENCE = re.compile(r"^<!-- snippet: (\S+) ([A-Za-z0-9_-]+) -->\n", re.M)
# A link and its comment; the comment alone where the link is missing. Not inside inline
# code (`<!-- code: PATH NAME -->` in a sentence that explains the syntax).
LINK = re.compile(r"(?:\[`[^`]*`\]\([^)\s]*\) |(?<!`))<!-- code: (\S+) ([A-Za-z0-9_-]+) -->")
FENCE = re.compile(r"(```[a-z]*\n)(.*?)^```", re.S | re.M)


class SnippetError(Exception):
    """A marker or a README reference that cannot be resolved."""


def marker(line):
    """('begin' | 'end', NAME) for a marker line, else None."""
    match = re.fullmatch(r"\s*(?://|#) snippet( end)?: ([A-Za-z0-9_-]+)\s*", line)
    if not match:
        return None
    return ("end" if match.group(1) else "begin", match.group(2))


class Snippet:
    def __init__(self, code, first, last):
        self.code = code  # dedented
        self.first, self.last = first, last  # its lines in the source, 1-based


def snippets_of(path, text):
    """{NAME: Snippet} of a source file's markers."""
    found, open_name, lines, first = {}, None, [], 0
    for number, line in enumerate(text.splitlines(), start=1):
        mark = marker(line)
        if mark is None:
            if open_name is not None:
                lines.append(line)
            continue
        kind, name = mark
        if kind == "begin":
            if open_name is not None:
                raise SnippetError(f"{path}:{number}: snippet {name} begins inside {open_name}")
            if name in found:
                raise SnippetError(f"{path}:{number}: snippet {name} is marked twice")
            open_name, lines, first = name, [], number + 1
        else:
            if name != open_name:
                raise SnippetError(f"{path}:{number}: 'snippet end: {name}' closes "
                                   f"{open_name or 'no snippet'}")
            found[name] = Snippet(dedent(lines), first, number - 1)
            open_name = None
    if open_name is not None:
        raise SnippetError(f"{path}: snippet {open_name} has no 'snippet end: {open_name}'")
    return found


def dedent(lines):
    """The lines less their common leading spaces (blank lines ignored), joined."""
    widths = [len(line) - len(line.lstrip(" ")) for line in lines if line.strip()]
    cut = min(widths, default=0)
    return "".join(line[cut:].rstrip() + "\n" for line in lines)


def snippet(readme, text, at, path, name, root, sources):
    """The Snippet NAME of PATH, which the README refers to at offset `at`."""
    where = f"{readme}:{text.count(chr(10), 0, at) + 1}"
    if path not in sources:
        source = root / path
        if not source.is_file():
            raise SnippetError(f"{where}: no source file {path}")
        sources[path] = snippets_of(path, source.read_text())
    if name not in sources[path]:
        raise SnippetError(f"{where}: {path} marks no snippet {name}")
    return sources[path][name]


def refresh(readme, text, root, sources):
    """The README with every referenced block and link made from its source's snippet."""
    pieces, at = [], 0
    for reference in REFERENCE.finditer(text):
        path, name = reference.group(1), reference.group(2)
        code = snippet(readme, text, reference.start(), path, name, root, sources).code
        fence = FENCE.match(text, reference.end())
        if not fence:
            where = f"{readme}:{text.count(chr(10), 0, reference.start()) + 1}"
            raise SnippetError(f"{where}: the snippet {name} needs a code block on the next line")
        pieces.append(text[at:fence.start(2)])
        pieces.append(code)
        at = fence.end(2)
    pieces.append(text[at:])
    text = "".join(pieces)

    def link(match):
        path, name = match.group(1), match.group(2)
        lines = snippet(readme, text, match.start(), path, name, root, sources)
        target = os.path.relpath(root / path, (root / readme).parent)
        return (f"[`{path}:{lines.first}-{lines.last}`]({target}#L{lines.first}-L{lines.last})"
                f" <!-- code: {path} {name} -->")
    return LINK.sub(link, text)


def readmes(root):
    listed = subprocess.run(["git", "-C", str(root), "ls-files", "*README.md", "docs/*.md"],
                            capture_output=True, text=True, check=False).stdout.split()
    found = sorted(root.rglob("README.md")) + sorted(root.glob("docs/*.md"))  # not a clone
    return listed or [str(p.relative_to(root)) for p in found]


def check(root, write, out=print):
    """0 when every block is its source's snippet (or was rewritten), else 1."""
    sources, stale, errors, count = {}, [], [], 0
    for readme in readmes(root):
        path = root / readme
        text = path.read_text()
        count += len(REFERENCE.findall(text)) + len(LINK.findall(text))
        try:
            updated = refresh(readme, text, root, sources)
        except SnippetError as error:
            errors.append(str(error))
            continue
        if updated != text:
            if write:
                path.write_text(updated)
                out(f"{readme}: rewrote its snippets")
            else:
                stale.append(readme)
    for error in errors:
        out(error)
    if stale:
        out("stale: the source says otherwise than the code shown in " + ", ".join(stale) +
            "; scripts/readme_snippets.py --write copies it in")
    if errors or stale:
        return 1
    if not write:
        out(f"{count} snippets and links in the READMEs are their sources' code and lines")
    return 0


def self_test():
    """The check on a planted tree: a clean one passes, each mistake fails."""
    source = ("int f(int x) {\n"
              "  // snippet: twice\n"
              "  const int y = x * 2;\n"
              "\n"
              "  return y;\n"
              "  // snippet end: twice\n"
              "}\n")
    readme = ("Doubling:\n\n"
              "<!-- snippet: lib/f.cpp twice -->\n"
              "```cpp\n"
              "const int y = x * 2;\n"
              "\n"
              "return y;\n"
              "```\n"
              "\n"
              "Read it: [`lib/f.cpp:3-5`](lib/f.cpp#L3-L5) <!-- code: lib/f.cpp twice -->\n"
              "(A link is written before `<!-- code: PATH NAME -->`.)\n")
    cases = [
        ("as written", source, readme, 0),
        ("a source edited without its README", source.replace("x * 2", "x * 3"), readme, 1),
        ("a README edited without its source", source, readme.replace("return y", "return x"), 1),
        ("indentation kept", source, readme.replace("\nreturn y", "\n  return y"), 1),
        ("a line added above the snippet", "// f doubles\n" + source, readme, 1),
        ("a link's lines edited by hand", source, readme.replace("f.cpp#L3-L5", "f.cpp#L3-L6"), 1),
        ("a link to a snippet the source does not mark", source,
         readme.replace("code: lib/f.cpp twice", "code: lib/f.cpp thrice"), 1),
        # The rest of the file is the README's block: only the missing marker is wrong.
        ("no end marker", source.replace("  // snippet end: twice\n}\n", ""), readme, 1),
        ("a snippet the source does not mark", source, readme.replace("f.cpp twice", "f.cpp thrice"), 1),
        ("a source that does not exist", source, readme.replace("lib/f.cpp", "lib/g.cpp"), 1),
        ("no block after the reference", source, readme.replace("```cpp\n", "text\n```cpp\n"), 1),
        ("a snippet marked twice", source.replace("}\n", "// snippet: twice\n// snippet end: twice\n}\n"),
         readme, 1),
    ]
    failures = []
    for what, source_text, readme_text, expected in cases:
        with tempfile.TemporaryDirectory() as folder:
            root = Path(folder)
            (root / "lib").mkdir()
            (root / "lib" / "f.cpp").write_text(source_text)
            (root / "README.md").write_text(readme_text)
            said = []
            status = check(root, write=False, out=said.append)
            if status != expected:
                failures.append(f"{what}: exit {status}, expected {expected} ({'; '.join(said)})")
            if expected == 1:  # --write repairs a stale block, and nothing else
                fixable = what in ("a source edited without its README", "indentation kept",
                                   "a README edited without its source",
                                   "a line added above the snippet", "a link's lines edited by hand")
                check(root, write=True, out=lambda _: None)
                repaired = check(root, write=False, out=lambda _: None) == 0
                if repaired != fixable:
                    failures.append(f"{what}: --write {'did not repair' if fixable else 'hid'} it")
    for failure in failures:
        print("FAILED:", failure)
    if failures:
        return 1
    print(f"self-test: {len(cases)} cases, each judged as it must be")
    return 0


def main(argv):
    if "-h" in argv or "--help" in argv:
        print(__doc__.strip())
        return 0
    if "--self-test" in argv:
        return self_test()
    try:
        return check(ROOT, write="--write" in argv)
    except SnippetError as error:
        print(error)
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
