"""The launching guide's example runner: how it reads tags and matches output."""
import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import guide_examples  # noqa: E402


def parse_text(text):
    with tempfile.NamedTemporaryFile("w", suffix=".md", delete=False) as f:
        f.write(text)
    try:
        return guide_examples.parse(f.name)
    finally:
        os.unlink(f.name)


class MatchTest(unittest.TestCase):
    def test_lines_follow_each_other_unless_dots_stand_between(self):
        self.assertTrue(guide_examples.matches(["a", "b"], "banner\na\nb\n"))
        self.assertFalse(guide_examples.matches(["a", "c"], "a\nb\nc\n"))
        self.assertTrue(guide_examples.matches(["a", "...", "c"], "a\nb\nb\nc\n"))
        self.assertFalse(guide_examples.matches(["a", "b"], "b\na\n"))
        self.assertFalse(guide_examples.matches(["a"], ""))

    def test_dots_inside_a_line_match_any_text(self):
        self.assertTrue(guide_examples.matches(["yes..."], "yes, max abs diff 1e-17\n"))
        self.assertTrue(guide_examples.matches(["Submitted batch job ..."],
                                               "Submitted batch job 12\n"))
        self.assertFalse(guide_examples.matches(["replicas identical: yes"],
                                                "replicas identical: no\n"))
        self.assertFalse(guide_examples.matches(["a.b"], "axb\n"))


class ParseTest(unittest.TestCase):
    def test_tagged_examples_and_their_steps(self):
        examples, problems = parse_text(
            "text\n<!-- example: shell -->\n```console\n$ echo a\na\n$ true\n```\n"
            "```\nnot an example\n```\n")
        self.assertEqual(problems, [])
        self.assertEqual(len(examples), 1)
        self.assertEqual(examples[0].kind, "shell")
        self.assertEqual(examples[0].steps, [("echo a", ["a"]), ("true", [])])

    def test_untagged_or_unknown_examples_are_problems(self):
        _, problems = parse_text("```sh\n$ ls\n```\n")
        self.assertIn("without", problems[0])
        _, problems = parse_text("<!-- example: cloud -->\n```console\n$ ls\n```\n")
        self.assertIn("unknown example kind", problems[0])
        # A tag belongs to the block right after it.
        _, problems = parse_text("<!-- example: shell -->\nprose\n```console\n$ ls\n```\n")
        self.assertIn("without", problems[0])


if __name__ == "__main__":
    unittest.main()
