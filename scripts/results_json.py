"""Writes a results document the way the committed results files are laid out: one line
per top-level field, then one line per row of its list of rows, so that a regenerated
file's diff shows which rows changed. Imported by the scripts that write results."""
import json
import pathlib


def write(path, document, rows="runs"):
    """Writes `document` (a dict whose `rows` entry is a list) to `path`; returns the text."""
    text = "{" + ",\n ".join(f"{json.dumps(k)}: {json.dumps(v)}" for k, v in document.items()
                             if k != rows)
    text += f',\n {json.dumps(rows)}: [\n  ' + ",\n  ".join(
        json.dumps(r) for r in document[rows]) + "\n ]}\n"
    json.loads(text)  # well-formed
    pathlib.Path(path).write_text(text)
    print(f"wrote {path}")
    return text
