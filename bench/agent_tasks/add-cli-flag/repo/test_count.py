from count import count_lines, main


def test_count_lines():
    assert count_lines("a\nb\n") == 2


def test_main_prints_lines(tmp_path, capsys):
    path = tmp_path / "f.txt"
    path.write_text("one two\nthree\n")
    assert main([str(path)]) == 0
    assert capsys.readouterr().out == "2\n"
