"""quantize/common/credentials.py: a URL's password hidden, the rest of it as given."""
import pytest

from quantize.common.credentials import check_folder_names, hide, redact, redact_override, redact_values
from quantize.common.errors import UserError


@pytest.mark.parametrize("url", ["sqlite:////tmp/a@b/mlflow.db", "file:///tmp/a@b/mlruns",
                                 "git+https://github.com/org/repo@v1.2", "http://me@127.0.0.1:5000",
                                 "sqlite:///mlflow.db", "/data/a:b@c/mlruns"])
def test_a_url_without_a_password_is_kept_as_given(url):
    """An `@` in a sqlite path or a git ref was re-encoded (a%40b): a rerun of
    the recorded command made its store under a folder literally named a%40b."""
    assert redact(url) == url
    assert redact_override(f"tracking.uri={url}") == f"tracking.uri={url}"


@pytest.mark.parametrize("url, shown", [
    ("postgresql://bench:s3cret@db.lab/mlflow", "postgresql://bench:***@db.lab/mlflow"),
    ("postgresql://bench:my s3cret@db.lab:5432/mlflow", "postgresql://bench:***@db.lab:5432/mlflow"),
    ("mysql+pymysql://root:p@ss@127.0.0.1:3307/optuna?charset=utf8mb4",
     "mysql+pymysql://root:***@127.0.0.1:3307/optuna?charset=utf8mb4"),
    ("postgresql://bench:pa/ss@db.lab/mlflow", "postgresql://bench:***@db.lab/mlflow"),
    ("https://me:s3cret@mlflow.lab/a@b", "https://me:***@mlflow.lab/a@b")])
def test_a_password_is_hidden_whatever_it_holds(url, shown):
    assert redact(url) == shown
    assert redact_values({"tracking": {"uri": url}}) == {"tracking": {"uri": shown}}
    assert redact_override(f"tracking.uri={url}") == f"tracking.uri={shown}"


@pytest.mark.parametrize("url", ["https://mlflow.lab:5000/path@x", "http://127.0.0.1:5000/runs@x",
                                 "https://host:8080?q=a@b", "https://host:8080#a@b",
                                 "postgresql://db.lab:5432/mlflow?sslrootcert=/certs/me@corp.pem",
                                 "http://127.0.0.1:5000/a:b@c", r"https\://mlflow.lab\:5000/path@x",
                                 r"postgresql\://db.lab\:5432/mlflow?sslrootcert=/certs/me@corp.pem"])
def test_a_port_followed_by_an_at_in_the_path_or_query_is_no_password(url):
    """The `@` after the host's port was taken for the end of a password:
    https://h:5000/path@x was written as https://h:***@x, a URL that names another host."""
    assert redact(url) == url
    assert redact_override(f"tracking.uri={url}") == f"tracking.uri={url}"


@pytest.mark.parametrize("url, shown", [
    ("postgresql://db.lab/mlflow?user=bench&password=s3cret", "postgresql://db.lab/mlflow?user=bench&password=***"),
    ("postgresql://db.lab/mlflow?password=s3cret&sslmode=require",
     "postgresql://db.lab/mlflow?password=***&sslmode=require"),
    ("mysql+pymysql://db.lab/optuna?user=root&passwd=s3cret", "mysql+pymysql://db.lab/optuna?user=root&passwd=***"),
    (r"postgresql\://db.lab/mlflow?user=bench&password=s3cret", r"postgresql\://db.lab/mlflow?user=bench&password=***"),
    ("postgresql://bench:s3cret@db.lab:5432/mlflow?sslrootcert=/certs/me@corp.pem",
     "postgresql://bench:***@db.lab:5432/mlflow?sslrootcert=/certs/me@corp.pem")])
def test_a_password_in_the_query_string_or_before_a_later_at_is_hidden(url, shown):
    assert redact(url) == shown
    assert redact_values({"tracking": {"uri": url}}) == {"tracking": {"uri": shown}}
    assert redact_override(f"tracking.uri={url}") == f"tracking.uri={shown}"
    assert hide(f"cannot reach {url}", url) == f"cannot reach {shown}"


@pytest.mark.parametrize("override, shown", [
    ("tracking.uri=http://u:S3cret@h1,http://u:S3cret@h2", "tracking.uri=http://u:***@h1,http://u:***@h2"),
    ("tracking.uri=sqlite:///a.db,http://u:S3cret@h2:5000", "tracking.uri=sqlite:///a.db,http://u:***@h2:5000"),
    ("x=[http://u:S3cret@h,http://u:Other1@h]", "x=[http://u:***@h,http://u:***@h]"),
    ("x={a: 'http://u:S3cret@h', b: 2}", "x={a: 'http://u:***@h', b: 2}"),
    ("x=choice(http://u:S3cret@h,b)", "x=choice(http://u:***@h,b)"),
    ("+x='postgresql://u:S3c,ret@h/db'", "+x='postgresql://u:***@h/db'"),
    (r"tracking.uri=http\://u\:S3c\ ret@h1\:5000", r"tracking.uri=http\://u\:***@h1\:5000")])
def test_a_password_in_a_sweep_a_list_or_a_dict_override_is_hidden(override, shown):
    """Only a value that was one whole URL was redacted: `-m tracking.uri=http://u:<pw>@h1,http://u:<pw>@h2`
    (or a list, a dict) kept its passwords in the recorded command and FAILED.json."""
    assert redact_override(override) == shown
    assert "S3c" not in shown and "Other1" not in shown


@pytest.mark.parametrize("override", ["x=[sqlite:////tmp/a@b/mlflow.db,https://h:5000/p@x]", "seed=0,1,2",
                                      "x=range(1,3)", "~tracking.uri", "x={a: 'git+https://github.com/o/r@v1'}"])
def test_a_sweep_list_or_dict_override_without_a_password_is_kept_as_typed(override):
    assert redact_override(override) == override


@pytest.mark.parametrize("override, shown", [
    (r"tracking.uri='http://u:S3c\'ret@h'", "tracking.uri='http://u:***@h'"),
    (r'tracking.uri="http://u:S3c\"ret@h"', 'tracking.uri="http://u:***@h"'),
    (r"tracking.uri=choice('http://u:S3c\'ret@h',b)", "tracking.uri=choice('http://u:***@h',b)"),
    (r"x=['http://u:S3c\\\'ret@h']", "x=['http://u:***@h']")])   # a `\'` in the password
def test_a_password_with_an_escaped_quote_is_hidden_as_typed(override, shown):
    """Hydra reads `'http://u:S3c\\'ret@h'` as the password S3c'ret, which is not
    what was typed: the password stayed in the recorded command, the logs and .hydra/."""
    assert redact_override(override) == shown


@pytest.mark.parametrize("url, shown", [
    ("postgresql://db.lab/mlflow?password=S3c'ret", "postgresql://db.lab/mlflow?password=***"),
    ('postgresql://db.lab/mlflow?password=S3c"ret&sslmode=require', "postgresql://db.lab/mlflow?password=***&sslmode=require"),
    ("postgresql://db.lab/mlflow?user=u&password=S3c ret", "postgresql://db.lab/mlflow?user=u&password=***"),
    ("'postgresql://db.lab/mlflow?password=S3cret'", "'postgresql://db.lab/mlflow?password=***'")])
def test_a_query_password_with_a_quote_or_a_space_is_hidden_whole(url, shown):
    """The query's password ended at a quote or a space: password=S3c'ret was shown as password=***'ret."""
    assert redact(url) == shown
    assert redact_values({"tracking": {"uri": url}}) == {"tracking": {"uri": shown}}
    assert redact_override(f"tracking.uri={url}") == f"tracking.uri={shown}"


@pytest.mark.parametrize("override, shown", [
    (r"tracking.uri='postgresql://h/db?password=S3c\'ret'", "tracking.uri='postgresql://h/db?password=***'"),
    (r"tracking.uri='postgresql://h/db?password=S3c\'ret&x=1',b", "tracking.uri='postgresql://h/db?password=***&x=1',b"),
    (r"tracking.uri=postgresql\://h/db?password=S3c\ ret", r"tracking.uri=postgresql\://h/db?password=***")])
def test_a_query_password_with_an_escaped_quote_or_space_is_hidden_as_typed(override, shown):
    assert redact_override(override) == shown


@pytest.mark.parametrize("dirs, overrides, excluded", [
    ({"hydra.sweep.subdir": "${hydra.job.num}"}, ["tracking.uri=http://u:S3cret@h"], []),
    ({"hydra.sweep.subdir": "${hydra.job.override_dirname}"}, ["tracking.uri=http://me@h", "seed=0,1"], []),
    ({"hydra.sweep.subdir": "${hydra.job.override_dirname}"}, ["tracking.uri=http://u:S3cret@h"], ["tracking.uri"])])
def test_job_folders_that_cannot_show_a_password_are_taken(dirs, overrides, excluded):
    check_folder_names(dirs, overrides, excluded)


@pytest.mark.parametrize("spelled", ["${hydra.job.override_dirname}", "out/${hydra:job.override_dirname}",
                                     "${hydra: job.override_dirname}", "${hydra:'job.override_dirname'}"])
def test_job_folders_named_by_an_override_with_a_password_are_refused_naming_the_exclusion(spelled):
    with pytest.raises(UserError) as e:   # the node's path, or Hydra's resolver
        check_folder_names({"hydra.sweep.dir": "out", "hydra.sweep.subdir": spelled},
                           ["seed=0,1", "+tracking.uri=postgresql://h/db?password=S3cret"], ["seed"])
    assert "hydra.sweep.subdir names" in str(e.value) and "S3cret" not in str(e.value)
    assert "hydra.job.config.override_dirname.exclude_keys=[seed,tracking.uri]" in str(e.value)
