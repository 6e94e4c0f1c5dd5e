//! The documentation's links hold: every relative link in every tracked Markdown file names a
//! file or folder that exists, and every `#anchor` on a Markdown page names one of its headings,
//! slugged as GitHub does. A page moved or a heading renamed fails here, not for a reader.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Component, Path, PathBuf};
use std::process::Command;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// A link found on a page: the line it is on and its target as written.
#[derive(Debug, PartialEq, Eq)]
struct Link {
    line: usize,
    target: String,
}

/// GitHub's anchor for a heading: the text without markup, lowercased, with every character but
/// letters, digits, spaces, '-' and '_' dropped, and spaces turned into '-'.
fn slug(heading: &str) -> String {
    let text = strip_links(heading);
    text.trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// `[text](target)` becomes `text`, as a heading's anchor reads it.
fn strip_links(text: &str) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(open) = rest.find('[') {
        out.push_str(&rest[..open]);
        let after = &rest[open + 1..];
        match after.find("](").and_then(|close| {
            let end = after[close + 2..].find(')')?;
            Some((close, close + 2 + end))
        }) {
            Some((close, end)) => {
                out.push_str(&after[..close]);
                rest = &after[end + 1..];
            }
            None => {
                out.push('[');
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

/// The page's lines outside fenced code blocks, with their line numbers.
fn prose(text: &str) -> Vec<(usize, &str)> {
    let mut fence: Option<&str> = None;
    let mut lines = Vec::new();
    for (index, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        let marker = ["```", "~~~"].into_iter().find(|m| trimmed.starts_with(m));
        match (fence, marker) {
            (None, Some(m)) => fence = Some(m),
            (Some(open), Some(m)) if open == m => fence = None,
            (None, None) => lines.push((index + 1, line)),
            _ => {}
        }
    }
    lines
}

/// Code spans hold no links: `[a](b)` inside backticks is text.
fn blank_code_spans(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut in_code = false;
    for c in line.chars() {
        if c == '`' {
            in_code = !in_code;
            out.push(c);
        } else {
            out.push(if in_code { ' ' } else { c });
        }
    }
    out
}

/// The anchors of a page's headings, with GitHub's -1, -2, ... for repeated ones.
fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen = BTreeMap::<String, usize>::new();
    let mut out = BTreeSet::new();
    for (_, line) in prose(text) {
        let hashes = line.chars().take_while(|c| *c == '#').count();
        if !(1..=6).contains(&hashes) || !line[hashes..].starts_with(' ') {
            continue;
        }
        let base = slug(line[hashes..].trim_end_matches('#'));
        let count = seen.entry(base.clone()).or_default();
        out.insert(match *count {
            0 => base,
            n => format!("{base}-{n}"),
        });
        *count += 1;
    }
    out
}

/// Inline links and images `[text](target "title")` and reference definitions `[x]: target`.
fn links(text: &str) -> Vec<Link> {
    let mut out = Vec::new();
    for (line_number, line) in prose(text) {
        let line = blank_code_spans(line);
        let mut rest = line.as_str();
        while let Some(at) = rest.find("](") {
            let after = &rest[at + 2..];
            let end = after.find(')').unwrap_or(after.len());
            let target = after[..end].split_whitespace().next().unwrap_or("");
            let target = target.trim_start_matches('<').trim_end_matches('>');
            out.push(Link {
                line: line_number,
                target: target.to_owned(),
            });
            rest = &after[end..];
        }
        let trimmed = line.trim_start();
        if trimmed.starts_with('[')
            && let Some(close) = trimmed.find("]:")
            && !trimmed[1..close].contains(']')
            && let Some(target) = trimmed[close + 2..].split_whitespace().next()
        {
            out.push(Link {
                line: line_number,
                target: target.to_owned(),
            });
        }
    }
    out
}

/// Whether a link leaves the repository (a URL, mail), so only a browser can check it.
fn external(target: &str) -> bool {
    let scheme = target.split(':').next().unwrap_or("");
    target.contains(':')
        && !scheme.is_empty()
        && scheme
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
}

/// `page`'s directory joined with `relative`, `..` resolved, or `None` if it climbs out of the
/// repository.
fn resolve(page: &Path, relative: &str) -> Option<PathBuf> {
    let mut out = PathBuf::new();
    let base = page.parent().unwrap_or(Path::new(""));
    for component in base.join(relative).components() {
        match component {
            Component::Normal(part) => out.push(part),
            Component::ParentDir => {
                if !out.pop() {
                    return None;
                }
            }
            Component::CurDir => {}
            Component::RootDir | Component::Prefix(_) => return None,
        }
    }
    Some(out)
}

/// Every broken link among `pages` (path relative to the root → text), as `page:line: why`.
/// `exists` says whether a repository path is there.
fn broken(pages: &BTreeMap<PathBuf, String>, exists: impl Fn(&Path) -> bool) -> Vec<String> {
    let anchors: BTreeMap<&PathBuf, BTreeSet<String>> = pages
        .iter()
        .map(|(path, text)| (path, anchors(text)))
        .collect();
    let mut problems = Vec::new();
    for (page, text) in pages {
        for link in links(text) {
            let problem = check(page, &link.target, &anchors, &exists);
            if let Some(why) = problem {
                problems.push(format!(
                    "{}:{}: {}: {why}",
                    page.display(),
                    link.line,
                    link.target
                ));
            }
        }
    }
    problems
}

fn check(
    page: &Path,
    target: &str,
    anchors: &BTreeMap<&PathBuf, BTreeSet<String>>,
    exists: &impl Fn(&Path) -> bool,
) -> Option<String> {
    if target.is_empty() {
        return Some("an empty target".to_owned());
    }
    if external(target) {
        return None;
    }
    let (path, anchor) = match target.split_once('#') {
        Some((path, anchor)) => (path, Some(anchor)),
        None => (target, None),
    };
    let file = if path.is_empty() {
        page.to_path_buf()
    } else {
        let Some(file) = resolve(page, path) else {
            return Some("leads out of the repository".to_owned());
        };
        if !exists(&file) {
            return Some(format!("{} does not exist", file.display()));
        }
        file
    };
    let anchor = anchor?;
    // Anchors into other files (a line of source, say) are GitHub's to resolve.
    let known = anchors.get(&file)?;
    if known.contains(anchor) {
        None
    } else {
        Some(format!(
            "no heading of {} has the anchor #{anchor}",
            file.display()
        ))
    }
}

/// The Markdown files git tracks; in a copy without git, every `*.md` outside `target/` and
/// hidden folders, which is the same set.
fn tracked_markdown() -> Vec<PathBuf> {
    let git = Command::new("git")
        .args(["ls-files", "-z", "--cached", "--", "*.md"])
        .current_dir(ROOT)
        .output();
    match git {
        Ok(output) if output.status.success() => output
            .stdout
            .split(|b| *b == 0)
            .filter(|name| !name.is_empty())
            .map(|name| PathBuf::from(String::from_utf8_lossy(name).into_owned()))
            .collect(),
        _ => {
            let mut found = Vec::new();
            walk(Path::new(ROOT), Path::new(""), &mut found);
            found
        }
    }
}

fn walk(root: &Path, dir: &Path, found: &mut Vec<PathBuf>) {
    let entries = std::fs::read_dir(root.join(dir))
        .unwrap_or_else(|e| panic!("read {}: {e}", root.join(dir).display()));
    for entry in entries {
        let entry = entry.unwrap_or_else(|e| panic!("read {}: {e}", dir.display()));
        let name = entry.file_name();
        let path = dir.join(&name);
        let name = name.to_string_lossy();
        if name.starts_with('.') || (dir.as_os_str().is_empty() && name == "target") {
            continue;
        }
        if entry.path().is_dir() {
            walk(root, &path, found);
        } else if name.ends_with(".md") {
            found.push(path);
        }
    }
}

#[test]
fn every_relative_link_and_anchor_resolves() {
    let root = Path::new(ROOT);
    let pages: BTreeMap<PathBuf, String> = tracked_markdown()
        .into_iter()
        .map(|path| {
            let text = std::fs::read_to_string(root.join(&path))
                .unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
            (path, text)
        })
        .collect();
    assert!(
        pages.contains_key(Path::new("README.md"))
            && pages.contains_key(Path::new("docs/README.md")),
        "the README and the docs index are tracked: {:?}",
        pages.keys().collect::<Vec<_>>()
    );
    let problems = broken(&pages, |path| root.join(path).exists());
    assert!(
        problems.is_empty(),
        "broken links:\n{}",
        problems.join("\n")
    );
}

#[test]
fn slugs_follow_github() {
    assert_eq!(slug("The safety rule"), "the-safety-rule");
    assert_eq!(slug("`workspace-gc create`"), "workspace-gc-create");
    assert_eq!(
        slug("OpenShift Pipelines' pruner"),
        "openshift-pipelines-pruner"
    );
    assert_eq!(
        slug("RBAC, the admission guard"),
        "rbac-the-admission-guard"
    );
    assert_eq!(
        slug("snake_case and [a link](x.md)"),
        "snake_case-and-a-link"
    );
    assert_eq!(slug("Größe ≈ 2"), "größe--2");
}

#[test]
fn repeated_headings_are_numbered_and_code_is_no_heading() {
    let text = "# Tests\n## Tests\n```\n# not a heading\n```\n### Tests\n#nospace\n";
    let found = anchors(text);
    let expected: BTreeSet<String> = ["tests", "tests-1", "tests-2"].map(String::from).into();
    assert_eq!(found, expected);
}

#[test]
fn links_outside_code_are_found() {
    let text = "see [a](docs/a.md#x) and `[not](this)`\n```\n[nor](this)\n```\n\
                ![img](i.png \"title\") [ref]: r.md\n[ref]: other.md\n";
    let found: Vec<_> = links(text)
        .into_iter()
        .map(|l| (l.line, l.target))
        .collect();
    assert_eq!(
        found,
        [
            (1, "docs/a.md#x".to_owned()),
            (5, "i.png".to_owned()),
            (6, "other.md".to_owned())
        ]
    );
}

/// The checker itself can fail: a missing file, a missing anchor, a path out of the repository.
#[test]
fn broken_links_are_reported() {
    let pages: BTreeMap<PathBuf, String> = [
        (
            "README.md",
            "# Top\n[ok](docs/a.md#usage) [ok](#top) [web](https://x.y/#z) [gone](docs/b.md)\n",
        ),
        (
            "docs/a.md",
            "# A\n## Usage\n[ok](../README.md#top) [bad](../README.md#nope) [bad](#usage-1)\n\
             [out](../../etc/passwd) [ok](../src/lib.rs#L10)\n",
        ),
    ]
    .into_iter()
    .map(|(path, text)| (PathBuf::from(path), text.to_owned()))
    .collect();
    let files = ["README.md", "docs/a.md", "src/lib.rs"];
    let problems = broken(&pages, |path| files.iter().any(|f| Path::new(f) == path));
    assert_eq!(
        problems,
        [
            "README.md:2: docs/b.md: docs/b.md does not exist",
            "docs/a.md:3: ../README.md#nope: no heading of README.md has the anchor #nope",
            "docs/a.md:3: #usage-1: no heading of docs/a.md has the anchor #usage-1",
            "docs/a.md:4: ../../etc/passwd: leads out of the repository",
        ]
    );
}

/// The Rust files under `src/`, relative to the crate root.
fn rust_sources() -> Vec<PathBuf> {
    fn visit(dir: &Path, found: &mut Vec<PathBuf>) {
        let entries = std::fs::read_dir(Path::new(ROOT).join(dir))
            .unwrap_or_else(|e| panic!("read {}: {e}", dir.display()));
        for entry in entries {
            let entry = entry.unwrap_or_else(|e| panic!("read {}: {e}", dir.display()));
            let path = dir.join(entry.file_name());
            if entry.path().is_dir() {
                visit(&path, found);
            } else if path.extension().is_some_and(|e| e == "rs") {
                found.push(path);
            }
        }
    }
    let mut found = Vec::new();
    visit(Path::new("src"), &mut found);
    found.sort();
    found
}

/// The files of `src/` that may send a request that changes the cluster; the README's code map
/// says what each changes.
const MUTATORS: [&str; 4] = [
    "src/cluster/writer.rs",
    "src/cluster/leader/kube_store.rs",
    "src/observe/access.rs",
    "src/creator.rs",
];

/// The calls in `code` (outside its test module) that send a request changing the cluster:
/// kube's `Api` writes, whose first argument is a reference, and raw HTTP writes. Whitespace
/// is ignored, so that a call rustfmt breaks over lines is found too.
fn mutating_calls(code: &str) -> Vec<&'static str> {
    const CALLS: [&str; 15] = [
        ".create(&",
        ".patch(&",
        ".patch_status(&",
        ".patch_metadata(&",
        ".patch_subresource(&",
        ".create_subresource(&",
        ".replace(&",
        ".replace_status(&",
        ".delete(&",
        ".delete_collection(&",
        ".evict(&",
        "Method::POST",
        "Method::PUT",
        "Method::PATCH",
        "Method::DELETE",
    ];
    let code = code
        .split("#[cfg(test)]\nmod tests")
        .next()
        .unwrap_or_default();
    let squeezed: String = code.chars().filter(|c| !c.is_whitespace()).collect();
    CALLS
        .into_iter()
        .filter(|call| squeezed.contains(call))
        .collect()
}

#[test]
fn a_mutating_call_is_found_wherever_rustfmt_puts_it() {
    let broken = "let x = api\n    .patch(\n        &name,\n        &params,\n    )\n    .await;";
    assert_eq!(mutating_calls(broken), vec![".patch(&"]);
    let in_tests = "fn f() {}\n#[cfg(test)]\nmod tests {\n    api.delete(&n, &p);\n}\n";
    assert!(mutating_calls(in_tests).is_empty());
    assert!(mutating_calls("let s = text.replace('a', \"b\");").is_empty());
}

/// Only the files the README names change the cluster, and each of them does (so the scan
/// still finds their calls).
#[test]
fn the_cluster_is_changed_only_by_the_files_the_readme_names() {
    let readme = std::fs::read_to_string(Path::new(ROOT).join("README.md")).expect("README");
    let mut elsewhere = Vec::new();
    for path in rust_sources() {
        let code = std::fs::read_to_string(Path::new(ROOT).join(&path)).expect("read a source");
        let calls = mutating_calls(&code);
        let name = path.to_string_lossy().into_owned();
        if MUTATORS.contains(&name.as_str()) {
            assert!(
                !calls.is_empty(),
                "{name} changes the cluster, but none of its calls was found"
            );
            let named = format!("`{}`", name.trim_start_matches("src/"));
            assert!(readme.contains(&named), "the README does not name {named}");
        } else if !calls.is_empty() {
            elsewhere.push(format!("{name}: {calls:?}"));
        }
    }
    assert!(
        elsewhere.is_empty(),
        "requests that change the cluster outside {MUTATORS:?}:\n{}",
        elsewhere.join("\n")
    );
}

/// The files the README's code map names, as paths under `src/`: each row's folder (its first
/// cell, or the row's above) joined to each file in backticks in its second cell.
fn code_map(readme: &str) -> BTreeSet<PathBuf> {
    let section = readme
        .split("## Code map")
        .nth(1)
        .and_then(|rest| rest.split("\n## ").next())
        .expect("a Code map section");
    let mut folder = String::new();
    let mut named = BTreeSet::new();
    for row in section.lines().filter(|l| l.starts_with('|')).skip(2) {
        let cells: Vec<&str> = row.split('|').map(str::trim).collect();
        let (Some(layer), Some(modules)) = (cells.get(1), cells.get(2)) else {
            continue;
        };
        if cells.get(3).is_none_or(|c| c.is_empty()) && !modules.contains(".rs") {
            break;
        }
        if !layer.is_empty() {
            folder = layer
                .split('`')
                .nth(1)
                .filter(|f| f.ends_with('/'))
                .unwrap_or_default()
                .to_owned();
        }
        for file in modules.split('`').skip(1).step_by(2) {
            named.insert(PathBuf::from("src").join(format!("{folder}{file}")));
        }
    }
    named
}

/// Every source file is in the README's code map, and every file the map names exists.
#[test]
fn the_code_map_names_every_source_file() {
    let readme = std::fs::read_to_string(Path::new(ROOT).join("README.md")).expect("README");
    let named = code_map(&readme);
    let sources: BTreeSet<PathBuf> = rust_sources()
        .into_iter()
        .filter(|p| !p.ends_with("lib.rs") && !p.ends_with("mod.rs"))
        .collect();
    let missing: Vec<_> = sources.difference(&named).collect();
    assert!(
        missing.is_empty(),
        "not in the README's code map: {missing:?}"
    );
    let gone: Vec<_> = named
        .iter()
        .filter(|p| !Path::new(ROOT).join(p).exists())
        .collect();
    assert!(
        gone.is_empty(),
        "the code map names files that do not exist: {gone:?}"
    );
}

/// Every row of the settings table (`src/config/settings.rs`) is a key of the shipped
/// `config.toml`, and each key there a row; each is a row of docs/configuration.md's key table
/// that names its classification; and its flag, where it has one, is one the page names.
#[test]
fn every_setting_is_in_the_shipped_file_and_the_docs_with_its_classification() {
    let read = |path: &str| std::fs::read_to_string(Path::new(ROOT).join(path)).expect(path);
    let shipped: toml::Table = read("config.toml").parse().expect("config.toml parses");
    let docs = read("docs/configuration.md");
    let settings = workspace_gc::config::settings();
    let mut wrong = Vec::new();
    for setting in &settings {
        let key = setting.key;
        let (section, name) = key.split_once('.').expect("section.key");
        if shipped.get(section).and_then(|s| s.get(name)).is_none() {
            wrong.push(format!("{key} is not in config.toml"));
        }
        let named = format!("`{key}`");
        let row = docs
            .lines()
            .find(|line| line.starts_with("| `") && line.contains(&named));
        let class = row.and_then(|row| row.trim_end_matches('|').rsplit('|').next());
        match class.map(str::trim) {
            None => wrong.push(format!("{key} has no row in docs/configuration.md")),
            Some(class) if class != setting.class.as_str() => wrong.push(format!(
                "docs/configuration.md says an override of {key} {class}; the table says {}",
                setting.class.as_str()
            )),
            Some(_) => {}
        }
        if let Some(flag) = setting.flag
            && !docs.contains(&format!("`{flag}`"))
        {
            wrong.push(format!(
                "{key}'s flag {flag} is not in docs/configuration.md"
            ));
        }
    }
    let in_file: usize = shipped
        .values()
        .map(|section| section.as_table().map_or(0, toml::Table::len))
        .sum();
    if in_file != settings.len() {
        wrong.push(format!(
            "config.toml has {in_file} keys, the settings table {}",
            settings.len()
        ));
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}
