"""The README's DSL examples run as written."""

import os
import re

README = os.path.join(os.path.dirname(__file__), "..", "..", "README.md")


def test_readme_dsl_examples_run():
    with open(README) as f:
        text = f.read()
    section = text[text.index("### Writing a fusion"):]
    section = section[:section.index("\n## ")]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    assert len(blocks) == 3
    namespace = {}
    for block in blocks:
        exec(compile(block, README, "exec"), namespace)  # noqa: S102 - our own README
    assert namespace["x"].grad is not None and namespace["weight"].grad is not None
    assert namespace["logits"].grad.shape == namespace["logits"].shape
