//! The documentation's links hold: every relative link in every tracked Markdown file names a
//! file or folder that exists, and every `#anchor` on a Markdown page names one of its headings,
//! slugged as GitHub does. A page moved or a heading renamed fails here, not for a reader.
//!
//! ARCHITECTURE.md is held to the code both ways: what it names exists as written, and what the
//! code has is listed (every source file in the code map, every file that changes the cluster,
//! every lock and concern in the state table, every step of a reconcile in the claim path).

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

/// The files of `src/` that may send a request that changes the cluster; ARCHITECTURE.md's code
/// map says what each changes.
const MUTATORS: [&str; 4] = [
    "src/cluster/writer.rs",
    "src/cluster/leader/kube_store.rs",
    "src/observe/access.rs",
    "src/creator.rs",
];

/// The calls that send a request changing the cluster: every write of kube's `Api` (its
/// subresources' too: evict, scale, approval, resize, ephemeral containers, token requests; the
/// entry API's `commit`; exec, attach and port-forward, which act in a pod), the event
/// recorder's `publish` (it creates and patches Events), and raw HTTP writes. Matched by name
/// whatever the arguments are: a name passed by value (`.delete(name, &params)`) is found too.
const CALLS: [&str; 35] = [
    ".create(",
    ".create_subresource(",
    ".create_token_request(",
    ".patch(",
    ".patch_status(",
    ".patch_metadata(",
    ".patch_subresource(",
    ".patch_scale(",
    ".patch_approval(",
    ".patch_resize(",
    ".patch_ephemeral_containers(",
    ".replace(",
    ".replace_status(",
    ".replace_subresource(",
    ".replace_scale(",
    ".replace_resize(",
    ".replace_ephemeral_containers(",
    ".delete(",
    ".delete_collection(",
    ".evict(",
    ".restart(",
    ".cordon(",
    ".uncordon(",
    ".commit(",
    ".exec(",
    ".attach(",
    ".portforward(",
    ".publish(",
    "Method::POST",
    "Method::PUT",
    "Method::PATCH",
    "Method::DELETE",
    "Request::post(",
    "Request::put(",
    "Request::patch(",
];

/// Calls outside [`MUTATORS`] that bear a write's name but send nothing, each as it stands in
/// its file (whitespace removed), and why. One no longer in its file fails the scan, so the list
/// stays the tree's: a new call of such a name is either a request or listed here, with its
/// reason.
const NOT_REQUESTS: [(&str, &str, &str); 8] = [
    (
        "src/cluster/leader/election.rs",
        "self.store.create(",
        "the election's Lease write, through its `LeaseStore` port, to kube_store.rs",
    ),
    (
        "src/cluster/leader/election.rs",
        "self.store.replace(",
        "the election's Lease write, through its `LeaseStore` port, to kube_store.rs",
    ),
    (
        "src/cluster/adapter.rs",
        "self.writer.delete(",
        "the real `Writes` port handing a delete to the writer",
    ),
    (
        "src/daemon/controller/delete.rs",
        "self.cluster.delete(",
        "the controller's delete, through its `Writes` port, to the writer",
    ),
    (
        "src/daemon/controller/slots.rs",
        "disputed_told.replace(",
        "Option::replace",
    ),
    (
        "src/cluster/cache/mod.rs",
        ".replace(Keyed(entry))",
        "HashSet::replace",
    ),
    (
        "src/cluster/served.rs",
        "slot.latest().replace(",
        "Option::replace",
    ),
    (
        "src/cluster/server_clock.rs",
        "self.publish(",
        "the server clock's own readings, to its watchers",
    ),
];

/// The calls in `code` (outside its test module) that send a request changing the cluster,
/// but for those `allowed` (texts as [`NOT_REQUESTS`] holds them); and those of `allowed` not
/// found. Whitespace is ignored, so that a call rustfmt breaks over lines is found too.
fn mutating_calls<'a>(code: &str, allowed: &[&'a str]) -> (Vec<&'static str>, Vec<&'a str>) {
    let code = code
        .split("#[cfg(test)]\nmod tests")
        .next()
        .unwrap_or_default();
    let mut squeezed: String = code.chars().filter(|c| !c.is_whitespace()).collect();
    let mut stale = Vec::new();
    for &text in allowed {
        if squeezed.contains(text) {
            squeezed = squeezed.replace(text, "");
        } else {
            stale.push(text);
        }
    }
    // `str::replace` with a char pattern: a char is never an object's name.
    let squeezed = squeezed.replace(".replace('", "");
    let calls = CALLS
        .into_iter()
        .filter(|call| squeezed.contains(call))
        .collect();
    (calls, stale)
}

#[test]
fn a_mutating_call_is_found_wherever_rustfmt_puts_it_and_whatever_its_arguments() {
    let found = |code: &str| mutating_calls(code, &[]).0;
    let broken = "let x = api\n    .patch(\n        &name,\n        &params,\n    )\n    .await;";
    assert_eq!(found(broken), vec![".patch("]);
    assert_eq!(found("api.delete(name, &params).await"), vec![".delete("]);
    assert_eq!(found("api.delete(\n    &name, &p)"), vec![".delete("]);
    assert_eq!(
        found("self.recorder.publish(&event, &reference).await"),
        vec![".publish("]
    );
    assert_eq!(
        found("let r = http::Request::post(url).body(b)?;"),
        vec!["Request::post("]
    );
    let in_tests = "fn f() {}\n#[cfg(test)]\nmod tests {\n    api.delete(&n, &p);\n}\n";
    assert!(found(in_tests).is_empty());
    assert!(found("let s = text.replace('a', \"b\");").is_empty());
    // What is allowed in a file is allowed there only: another call of the name is still found.
    let code = "told.replace(until);\napi.replace(name, &params, &claim);";
    assert_eq!(
        mutating_calls(code, &["told.replace("]),
        (vec![".replace("], vec![])
    );
    assert_eq!(
        mutating_calls("x.replace(y);", &["told.replace("]),
        (vec![".replace("], vec!["told.replace("])
    );
}

/// Only the files ARCHITECTURE.md names as writers change the cluster, and each of them does
/// (so the scan still finds their calls); elsewhere only the calls [`NOT_REQUESTS`] lists bear a
/// write's name, and each of those is still there.
#[test]
fn the_cluster_is_changed_only_by_the_files_the_architecture_names() {
    let architecture =
        std::fs::read_to_string(Path::new(ROOT).join("ARCHITECTURE.md")).expect("ARCHITECTURE.md");
    let mut wrong = Vec::new();
    for path in rust_sources() {
        let code = std::fs::read_to_string(Path::new(ROOT).join(&path)).expect("read a source");
        let name = path.to_string_lossy().into_owned();
        let allowed: Vec<&str> = NOT_REQUESTS
            .iter()
            .filter(|(file, _, _)| *file == name)
            .map(|(_, text, _)| *text)
            .collect();
        let (calls, stale) = mutating_calls(&code, &allowed);
        if MUTATORS.contains(&name.as_str()) {
            if calls.is_empty() {
                wrong.push(format!(
                    "{name} changes the cluster, but none of its calls was found"
                ));
            }
            let named = format!("`{name}`");
            if !architecture.contains(&named) {
                wrong.push(format!("ARCHITECTURE.md does not name {named}"));
            }
        } else if !calls.is_empty() {
            wrong.push(format!(
                "{name} sends requests that change the cluster, outside {MUTATORS:?}: {calls:?}"
            ));
        }
        for text in stale {
            wrong.push(format!(
                "NOT_REQUESTS lists `{text}` in {name}, which no longer has it"
            ));
        }
    }
    let sources: Vec<String> = rust_sources()
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    for (file, text, _) in NOT_REQUESTS {
        if !sources.iter().any(|s| s == file) {
            wrong.push(format!(
                "NOT_REQUESTS lists `{text}` in {file}, which does not exist"
            ));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// The files ARCHITECTURE.md's code map names, as paths under `src/`: each row's folder (its first
/// cell, or the row's above) joined to each file in backticks in its second cell.
fn code_map(page: &str) -> BTreeSet<PathBuf> {
    let section = page
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

/// Every source file is in ARCHITECTURE.md's code map, and every file the map names exists.
#[test]
fn the_code_map_names_every_source_file() {
    let page =
        std::fs::read_to_string(Path::new(ROOT).join("ARCHITECTURE.md")).expect("ARCHITECTURE.md");
    let named = code_map(&page);
    let sources: BTreeSet<PathBuf> = rust_sources()
        .into_iter()
        .filter(|p| !p.ends_with("lib.rs") && !p.ends_with("mod.rs"))
        .collect();
    let missing: Vec<_> = sources.difference(&named).collect();
    assert!(
        missing.is_empty(),
        "not in ARCHITECTURE.md's code map: {missing:?}"
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

/// What a code span of ARCHITECTURE.md names, and how it is held to the tree.
#[derive(Debug, PartialEq)]
enum Named<'a> {
    /// `src/cluster/writer.rs`, `src/decide/`: exists, relative to the repository.
    Path(&'a str),
    /// `index: RwLock<Index>`: stands, whitespace aside, in the file named with it.
    Field(&'a str),
    /// `decide`, `Writer::delete`, `Index`: a `fn` of that name, or a type declared, in the file
    /// named with it; of `Type::method`, the type named in the file and the `fn`.
    Item(&'a str),
}

fn named(span: &str) -> Option<Named<'_>> {
    let word = |w: &str| {
        !w.is_empty()
            && !w.starts_with(|c: char| c.is_ascii_digit())
            && w.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
    };
    let path_char = |c: char| c.is_ascii_alphanumeric() || "_.-/".contains(c);
    if span.contains('/') && !span.starts_with('/') && span.chars().all(path_char) {
        return Some(Named::Path(span));
    }
    if let Some((field, _)) = span.split_once(": ")
        && word(field)
    {
        return Some(Named::Field(span));
    }
    let item = span.strip_suffix("()").unwrap_or(span);
    item.split("::").all(word).then_some(Named::Item(item))
}

/// The blocks of a Markdown page whose spans are read together: each table row, each list item
/// with its continuation lines, each paragraph; fenced code is left out.
fn blocks(page: &str) -> Vec<String> {
    let mut blocks: Vec<String> = Vec::new();
    let mut open = false;
    let mut fenced = false;
    for line in page.lines() {
        if line.starts_with("```") {
            fenced = !fenced;
            open = false;
            continue;
        }
        let trimmed = line.trim_start();
        let item = trimmed.starts_with("- ")
            || trimmed.starts_with('|')
            || trimmed
                .split_once(". ")
                .is_some_and(|(n, _)| !n.is_empty() && n.chars().all(|c| c.is_ascii_digit()));
        if fenced || trimmed.is_empty() || trimmed.starts_with('#') {
            open = false;
        } else if open && !item {
            if let Some(last) = blocks.last_mut() {
                last.push(' ');
                last.push_str(trimmed);
            }
        } else {
            blocks.push(trimmed.to_owned());
            open = !trimmed.starts_with('|');
        }
    }
    blocks
}

/// The spans of `block` that name something, each with the file it is looked for in: the
/// nearest `.rs` file named before it in the block, else the first named after it.
fn spans_with_files(block: &str) -> Vec<(Named<'_>, Option<&str>)> {
    let spans: Vec<Named> = block
        .split('`')
        .skip(1)
        .step_by(2)
        .filter_map(named)
        .collect();
    let files: Vec<(usize, &str)> = spans
        .iter()
        .enumerate()
        .filter_map(|(i, n)| match n {
            Named::Path(p) if p.ends_with(".rs") => Some((i, *p)),
            _ => None,
        })
        .collect();
    let file_of = |i: usize| {
        files
            .iter()
            .rev()
            .find(|(at, _)| *at < i)
            .or_else(|| files.iter().find(|(at, _)| *at > i))
            .map(|(_, f)| *f)
    };
    (0..spans.len())
        .map(file_of)
        .zip(spans)
        .map(|(f, s)| (s, f))
        .collect()
}

/// The text of a span or of code with its whitespace removed, as fields are compared.
fn squeeze(text: &str) -> String {
    text.chars().filter(|c| !c.is_whitespace()).collect()
}

/// What is wrong with the spans of `block`, read against `read` (a file's text, `None` when it
/// does not exist): each item and field is looked for in the file [`spans_with_files`] gives it.
fn wrong_spans(block: &str, read: &dyn Fn(&str) -> Option<String>) -> Vec<String> {
    let mut wrong = Vec::new();
    for (span, file) in spans_with_files(block) {
        match span {
            Named::Path(path) => {
                if read(path).is_none() {
                    wrong.push(format!("`{path}` does not exist"));
                }
            }
            Named::Field(field) | Named::Item(field) => {
                let Some(file) = file else {
                    wrong.push(format!(
                        "`{field}` is named with no file: name its file beside it"
                    ));
                    continue;
                };
                let code = read(file).unwrap_or_default();
                let found = match span {
                    Named::Field(_) => squeeze(&code).contains(&squeeze(field)),
                    _ => {
                        let words: Vec<&str> = field.split("::").collect();
                        let (last, before) = words.split_last().expect("one word at least");
                        let has_word = |w: &str| {
                            code.match_indices(w).any(|(at, _)| {
                                let edge = |c: Option<char>| {
                                    !c.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_')
                                };
                                edge(code[..at].chars().next_back())
                                    && edge(code[at + w.len()..].chars().next())
                            })
                        };
                        let declared = |w: &str| {
                            ["fn", "struct", "enum", "trait", "type"]
                                .iter()
                                .any(|k| has_word(&format!("{k} {w}")))
                        };
                        before.iter().all(|w| has_word(w))
                            && if before.is_empty() {
                                declared(last)
                            } else {
                                has_word(&format!("fn {last}"))
                                    || (has_word(last)
                                        && last.starts_with(|c: char| c.is_ascii_uppercase()))
                            }
                    }
                };
                if !found {
                    wrong.push(format!("`{field}` is not in {file}"));
                }
            }
        }
    }
    wrong
}

#[test]
fn a_span_that_left_its_file_is_reported() {
    let tree = |path: &str| -> Option<String> {
        match path {
            "src/a.rs" => Some("pub struct Writer {\n    index: RwLock<Index>,\n}\nimpl Writer {\n    pub fn delete() {}\n}\n".into()),
            "src/b.rs" => Some("fn deleted() {}\n".into()),
            "src/" => Some(String::new()),
            _ => None,
        }
    };
    let ok =
        "`src/a.rs` `Writer::delete`, `Writer`, `index: RwLock<Index>` and `src/` (`/metrics`)";
    assert_eq!(wrong_spans(ok, &tree), Vec::<String>::new());
    assert_eq!(
        wrong_spans("`src/b.rs` `delete`, then `src/a.rs` `delete`", &tree),
        vec!["`delete` is not in src/b.rs"]
    );
    assert_eq!(
        wrong_spans("`src/a.rs` `Reader::delete`, `index: Mutex<Index>`", &tree),
        vec![
            "`Reader::delete` is not in src/a.rs",
            "`index: Mutex<Index>` is not in src/a.rs"
        ]
    );
    assert_eq!(
        wrong_spans("`src/c.rs` `Writer` and `run` alone", &tree),
        vec![
            "`src/c.rs` does not exist",
            "`Writer` is not in src/c.rs",
            "`run` is not in src/c.rs"
        ]
    );
    assert_eq!(
        wrong_spans("`Writer` and nothing else", &tree),
        vec!["`Writer` is named with no file: name its file beside it"]
    );
    let page =
        "# T\n\nA `x` and\n`src/a.rs`.\n\n1. one `y`\n   `src/b.rs`\n- two\n| `z` | `src/` |\n";
    assert_eq!(
        blocks(page),
        vec![
            "A `x` and `src/a.rs`.",
            "1. one `y` `src/b.rs`",
            "- two",
            "| `z` | `src/` |"
        ]
    );
}

/// ARCHITECTURE.md is held to the code: every path in its code spans exists, every function,
/// type and field it names is in the file named with it (the code map's rows are held by
/// `the_code_map_names_every_source_file`).
#[test]
fn the_architecture_names_only_what_the_code_has() {
    let page =
        std::fs::read_to_string(Path::new(ROOT).join("ARCHITECTURE.md")).expect("ARCHITECTURE.md");
    let read = |path: &str| {
        let full = Path::new(ROOT).join(path);
        if full.is_dir() {
            Some(String::new())
        } else {
            std::fs::read_to_string(full).ok()
        }
    };
    let (overview, map) = page.split_once("## Code map").expect("a Code map section");
    let map_prose: Vec<&str> = map.lines().filter(|l| !l.starts_with('|')).collect();
    let mut wrong = Vec::new();
    for block in blocks(overview)
        .iter()
        .chain(&blocks(&map_prose.join("\n")))
    {
        for problem in wrong_spans(block, &read) {
            wrong.push(format!("{problem}\n    in: {block}"));
        }
    }
    assert!(
        wrong.is_empty(),
        "ARCHITECTURE.md names what the code no longer has; update the page:\n{}",
        wrong.join("\n")
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

// ARCHITECTURE.md's lists are complete: what follows reads the code itself (structs, impl
// blocks, calls) and fails when the page leaves out a lock, a concern or a step of the claim
// path, not only when it names one wrongly. The reading is lexical, not a parser: comments,
// string and char literals and `#[cfg(test)]` items are blanked first, so that braces balance
// and no word in a message or a test is read as code.

/// `source` reduced to its code: every comment, string and char literal, and every item under
/// `#[cfg(test)]`, blanked to spaces (line breaks kept).
fn code_of(source: &str) -> String {
    let chars: Vec<char> = source.chars().collect();
    let mut out = String::with_capacity(source.len());
    let blank = |c: char| if c == '\n' { '\n' } else { ' ' };
    let ident = |c: char| c.is_alphanumeric() || c == '_';
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        let start = i;
        if c == '/' && next == Some('/') {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            let mut depth = 0;
            while i < chars.len() {
                if chars[i] == '/' && chars.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if chars[i] == '*' && chars.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
        } else if (c == 'r' || c == 'b')
            && !(i > 0 && ident(chars[i - 1]))
            && let Some(hashes) = raw_string_opening(&chars[i..])
        {
            // r"…", r#"…"#, br"…": ends at a quote followed by as many hashes.
            i += hashes.1;
            let close: Vec<char> = std::iter::once('"')
                .chain(std::iter::repeat_n('#', hashes.0))
                .collect();
            while i < chars.len() && !chars[i..].starts_with(&close) {
                i += 1;
            }
            i = (i + close.len()).min(chars.len());
        } else if c == '"' {
            i += 1;
            while i < chars.len() && chars[i] != '"' {
                i += if chars[i] == '\\' { 2 } else { 1 };
            }
            i = (i + 1).min(chars.len());
        } else if c == '\'' && next == Some('\\') {
            i += 2;
            while i < chars.len() && chars[i] != '\'' {
                i += 1;
            }
            i = (i + 1).min(chars.len());
        } else if c == '\'' && chars.get(i + 2) == Some(&'\'') {
            i += 3;
        } else {
            out.push(c);
            i += 1;
            continue;
        }
        out.extend(chars[start..i].iter().map(|&c| blank(c)));
    }
    blank_test_items(out)
}

/// After an `r` or `br` at the start of `chars`: the number of hashes of a raw string literal
/// opening there, and the length of its opening; `None` when none opens there.
fn raw_string_opening(chars: &[char]) -> Option<(usize, usize)> {
    let prefix = if chars.starts_with(&['b', 'r']) {
        2
    } else if chars.first() == Some(&'r') {
        1
    } else {
        return None;
    };
    let hashes = chars[prefix..].iter().take_while(|c| **c == '#').count();
    (chars.get(prefix + hashes) == Some(&'"')).then_some((hashes, prefix + hashes + 1))
}

/// Blanks every item under `#[cfg(test)]` in `code` (comments and literals already blank): the
/// attribute and the item, through its block's closing brace or its `;`.
fn blank_test_items(mut code: String) -> String {
    const ATTRIBUTE: &str = "#[cfg(test)]";
    while let Some(at) = code.find(ATTRIBUTE) {
        let item = at + ATTRIBUTE.len();
        let end = match code[item..].find(['{', ';']) {
            Some(offset) if code.as_bytes()[item + offset] == b'{' => {
                closing(&code, item + offset).map_or(code.len(), |close| close + 1)
            }
            Some(offset) => item + offset + 1,
            None => code.len(),
        };
        let blanked: String = code[at..end]
            .chars()
            .map(|c| if c == '\n' { '\n' } else { ' ' })
            .collect();
        code.replace_range(at..end, &blanked);
    }
    code
}

/// The index of the brace that closes the one at `open`.
fn closing(code: &str, open: usize) -> Option<usize> {
    let mut depth = 0usize;
    for (at, b) in code.bytes().enumerate().skip(open) {
        match b {
            b'{' => depth += 1,
            b'}' => {
                depth -= 1;
                if depth == 0 {
                    return Some(at);
                }
            }
            _ => {}
        }
    }
    None
}

/// Where the word `word` stands in `code` (not as part of a longer identifier).
fn word_at(code: &str, word: &str) -> Vec<usize> {
    let ident = |c: Option<char>| c.is_some_and(|c| c.is_alphanumeric() || c == '_');
    code.match_indices(word)
        .map(|(at, _)| at)
        .filter(|&at| {
            !ident(code[..at].chars().next_back()) && !ident(code[at + word.len()..].chars().next())
        })
        .collect()
}

/// The identifier that starts `text` after any whitespace, if one does.
fn leading_ident(text: &str) -> Option<&str> {
    let text = text.trim_start();
    let end = text
        .find(|c: char| !(c.is_alphanumeric() || c == '_'))
        .unwrap_or(text.len());
    (end > 0).then_some(&text[..end])
}

/// `text` with its leading generic parameter list `<…>`, if any, removed.
fn skip_generics(text: &str) -> &str {
    let text = text.trim_start();
    if !text.starts_with('<') {
        return text;
    }
    let mut depth = 0;
    for (at, c) in text.char_indices() {
        match c {
            '<' => depth += 1,
            '>' => {
                depth -= 1;
                if depth == 0 {
                    return &text[at + 1..];
                }
            }
            _ => {}
        }
    }
    ""
}

/// A struct with named fields, as declared.
#[derive(Debug, PartialEq)]
struct Struct {
    name: String,
    /// Each field's name and its type, whitespace removed.
    fields: Vec<(String, String)>,
}

/// The structs with named fields that `code` (from [`code_of`]) declares.
fn structs(code: &str) -> Vec<Struct> {
    let mut found = Vec::new();
    for at in word_at(code, "struct") {
        let rest = &code[at + "struct".len()..];
        let Some(name) = leading_ident(rest) else {
            continue;
        };
        let Some(open) = rest.find(['{', '(', ';']) else {
            continue;
        };
        let open = at + "struct".len() + open;
        if code.as_bytes()[open] != b'{' {
            continue;
        }
        let Some(close) = closing(code, open) else {
            continue;
        };
        found.push(Struct {
            name: name.to_owned(),
            fields: fields(&code[open + 1..close]),
        });
    }
    found
}

/// The named fields of a struct's body: split at its top-level commas, attributes and
/// visibility left out.
fn fields(body: &str) -> Vec<(String, String)> {
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0i32, 0);
    let bytes = body.as_bytes();
    for (at, &b) in bytes.iter().enumerate() {
        match b {
            b'<' | b'(' | b'[' | b'{' => depth += 1,
            // `->` in a function type closes nothing.
            b'>' if at > 0 && bytes[at - 1] == b'-' => {}
            b'>' | b')' | b']' | b'}' => depth -= 1,
            b',' if depth == 0 => {
                parts.push(&body[start..at]);
                start = at + 1;
            }
            _ => {}
        }
    }
    parts.push(&body[start..]);
    parts
        .into_iter()
        .filter_map(|part| {
            let mut part = part.trim();
            while part.starts_with("#[") {
                part = part[part.find(']')? + 1..].trim_start();
            }
            if let Some(rest) = part.strip_prefix("pub") {
                part = rest.trim_start();
                if part.starts_with('(') {
                    part = part[part.find(')')? + 1..].trim_start();
                }
            }
            let colon = part.find(':')?;
            let name = part[..colon].trim();
            let name_ok = !name.is_empty() && name.chars().all(|c| c.is_alphanumeric() || c == '_');
            name_ok.then(|| (name.to_owned(), squeeze(&part[colon + 1..])))
        })
        .collect()
}

/// The methods of the impl blocks of `self_type` in `code`: each name and its body.
fn methods<'a>(code: &'a str, self_type: &str) -> Vec<(String, &'a str)> {
    let mut found = Vec::new();
    for at in word_at(code, "impl") {
        let Some(open) = code[at..].find('{').map(|o| at + o) else {
            continue;
        };
        let header = skip_generics(&code[at + "impl".len()..open]);
        let target = match word_at(header, "for").first() {
            Some(&f) => &header[f + "for".len()..],
            None => header,
        };
        if leading_ident(target) != Some(self_type) {
            continue;
        }
        let Some(close) = closing(code, open) else {
            continue;
        };
        let body = &code[open + 1..close];
        let mut depth = 0;
        let mut at = 0;
        while at < body.len() {
            match body.as_bytes()[at] {
                b'{' => depth += 1,
                b'}' => depth -= 1,
                _ if depth == 0 && word_at(&body[at..], "fn").first() == Some(&0) => {
                    let after = &body[at + 2..];
                    let (Some(name), Some(open)) = (leading_ident(after), after.find('{')) else {
                        break;
                    };
                    let open = at + 2 + open;
                    let Some(close) = closing(body, open) else {
                        break;
                    };
                    found.push((name.to_owned(), &body[open + 1..close]));
                    at = close;
                }
                _ => {}
            }
            at += 1;
        }
    }
    found
}

/// The methods `body` calls on `self`, in the order written: `self.f(` and `self.f::<`,
/// wherever rustfmt breaks the line around the dot.
fn self_calls(body: &str) -> Vec<String> {
    let mut joined = String::with_capacity(body.len());
    let mut chars = body.chars().peekable();
    while let Some(c) = chars.next() {
        if c.is_whitespace() {
            while chars.peek().is_some_and(|c| c.is_whitespace()) {
                chars.next();
            }
            if !(joined.ends_with('.') || chars.peek() == Some(&'.')) {
                joined.push(' ');
            }
        } else {
            joined.push(c);
        }
    }
    let joined = joined.replace("(self).", "self.");
    word_at(&joined, "self")
        .into_iter()
        .filter(|&at| joined[at + 4..].starts_with('.'))
        .filter_map(|at| {
            let name = leading_ident(&joined[at + 5..])?;
            let after = &joined[at + 5 + name.len()..];
            (after.starts_with('(') || after.starts_with("::<")).then(|| name.to_owned())
        })
        .collect()
}

#[test]
fn the_code_reader_sees_code_only() {
    let source = r##"
struct Lit { s: &'static str }
/// A { in a comment
pub(crate) struct Locks<'a> {
    /// Why.
    #[allow(dead_code)]
    pub(super) a: std::sync::Mutex<HashMap<K, (String, u32)>>,
    b: tokio::sync::RwLock<Option<X>>, // { }
    f: fn(u8) -> u8,
    c: &'a str,
}
struct Tuple(u8);
fn f() { let _ = "}{"; let _ = r#"}"#; let _ = '{'; let _ = '\''; }
#[cfg(test)]
mod tests {
    struct Hidden { a: Mutex<u8> }
}
impl<C: Cluster> Controller<C> {
    fn one(&self) -> u8 {
        if x { self.two(); } else { self.metrics.count() }
        self
            .three::<u8>(4);
        (self).four(self.five)
    }
    #[cfg(test)]
    fn hidden(&self) { self.six() }
}
impl Display for Controller<u8> { fn fmt(&self) { self.seven() } }
impl Other { fn eight(&self) {} }
"##;
    let code = code_of(source);
    assert_eq!(code.lines().count(), source.lines().count());
    let names: Vec<_> = structs(&code).into_iter().map(|s| s.name).collect();
    assert_eq!(names, ["Lit", "Locks"]);
    assert_eq!(
        structs(&code)[1].fields,
        [
            ("a", "std::sync::Mutex<HashMap<K,(String,u32)>>"),
            ("b", "tokio::sync::RwLock<Option<X>>"),
            ("f", "fn(u8)->u8"),
            ("c", "&'astr"),
        ]
        .map(|(n, t)| (n.to_owned(), t.to_owned()))
    );
    let found: Vec<_> = methods(&code, "Controller")
        .into_iter()
        .map(|(name, body)| (name, self_calls(body)))
        .collect();
    assert_eq!(
        found,
        [
            ("one".to_owned(), vec!["two", "three", "four"]),
            ("fmt".to_owned(), vec!["seven"]),
        ]
        .map(|(n, c)| (n, c.into_iter().map(String::from).collect::<Vec<_>>()))
    );
}

/// Every Rust file of `src/` but its test modules (the files `tests.rs`), as its path and its
/// code ([`code_of`]).
fn src_code() -> Vec<(String, String)> {
    rust_sources()
        .into_iter()
        .filter(|path| !path.ends_with("tests.rs"))
        .map(|path| {
            let source = std::fs::read_to_string(Path::new(ROOT).join(&path))
                .unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
            (path.to_string_lossy().into_owned(), code_of(&source))
        })
        .collect()
}

/// The identifiers a type is written with: `Arc<tokio::sync::Mutex<X>>` is Arc, tokio, sync,
/// Mutex, X.
fn type_words(ty: &str) -> impl Iterator<Item = &str> {
    ty.split(|c: char| !(c.is_alphanumeric() || c == '_'))
        .filter(|w| !w.is_empty())
}

/// The names that are locks: `Mutex` and `RwLock` (std's, tokio's, by any path) and every type
/// alias in `code` whose definition holds one (`type Shared<S> = Mutex<Registry<S>>`, and an
/// alias of that alias).
fn lock_names(code: &[(String, String)]) -> BTreeSet<String> {
    let mut aliases = Vec::new();
    for (_, code) in code {
        for at in word_at(code, "type") {
            let rest = &code[at + "type".len()..];
            let Some(name) = leading_ident(rest) else {
                continue;
            };
            let after = skip_generics(&rest.trim_start()[name.len()..]).trim_start();
            if let Some(definition) = after.strip_prefix('=') {
                let end = definition.find(';').unwrap_or(definition.len());
                aliases.push((name.to_owned(), definition[..end].to_owned(), code.as_str()));
            }
        }
    }
    let mut locks: BTreeSet<String> = ["Mutex", "RwLock"].map(String::from).into();
    loop {
        let more: Vec<String> = aliases
            .iter()
            .filter(|(name, definition, code)| {
                !locks.contains(name) && holds_lock(definition, code, &locks)
            })
            .map(|(name, _, _)| name.clone())
            .collect();
        if more.is_empty() {
            return locks;
        }
        locks.extend(more);
    }
}

/// The structs and enums `code` declares: a name declared in a file is that file's own type
/// there, whatever an alias of the same name elsewhere is.
fn local_types(code: &str) -> BTreeSet<&str> {
    ["struct", "enum"]
        .iter()
        .flat_map(|keyword| {
            word_at(code, keyword)
                .into_iter()
                .filter_map(|at| leading_ident(&code[at + keyword.len()..]))
        })
        .collect()
}

/// Whether a type written in `file_code` holds a lock: one of its words is in `locks`, and is
/// not a type the file declares itself.
fn holds_lock(ty: &str, file_code: &str, locks: &BTreeSet<String>) -> bool {
    let local = local_types(file_code);
    type_words(ty).any(|w| locks.contains(w) && !local.contains(w))
}

/// A field of a struct in `src/`, with the file that declares it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Field {
    file: String,
    owner: String,
    name: String,
    /// Its type, whitespace removed.
    ty: String,
}

impl Field {
    /// As ARCHITECTURE.md writes it, whitespace aside: `name: Type`.
    fn written(&self) -> String {
        format!("{}:{}", self.name, self.ty)
    }
}

/// Every field of every struct in `code`.
fn all_fields(code: &[(String, String)]) -> Vec<Field> {
    code.iter()
        .flat_map(|(file, code)| {
            structs(code).into_iter().flat_map(move |s| {
                s.fields.into_iter().map(move |(name, ty)| Field {
                    file: file.clone(),
                    owner: s.name.clone(),
                    name,
                    ty,
                })
            })
        })
        .collect()
}

/// Every lock field of `src/`: a field whose type holds a lock ([`lock_names`]), bare or in an
/// `Arc`, an `Option`, a map.
fn lock_fields(code: &[(String, String)]) -> Vec<Field> {
    let locks = lock_names(code);
    let file_code: BTreeMap<&str, &str> = code
        .iter()
        .map(|(file, code)| (file.as_str(), code.as_str()))
        .collect();
    all_fields(code)
        .into_iter()
        .filter(|f| holds_lock(&f.ty, file_code[f.file.as_str()], &locks))
        .collect()
}

/// The folder whose structs are the controller's concerns.
const CONCERNS_FOLDER: &str = "src/daemon/controller/";

/// The concerns `owner` holds, and theirs in turn, depth first: a concern is a struct declared
/// under [`CONCERNS_FOLDER`] that a concern (or `owner`, `Controller` at the top) holds in a
/// field of its own, not inside a lock (the state a lock guards is that lock's, not a concern).
fn concerns(code: &[(String, String)], owner: &str) -> Vec<(String, String)> {
    let locks = lock_fields(code);
    let fields = all_fields(code);
    let declared: BTreeMap<&str, &str> = fields
        .iter()
        .filter(|f| f.file.starts_with(CONCERNS_FOLDER))
        .map(|f| (f.owner.as_str(), f.file.as_str()))
        .collect();
    fn visit(
        holder: &str,
        fields: &[Field],
        locks: &[Field],
        declared: &BTreeMap<&str, &str>,
        found: &mut Vec<(String, String)>,
    ) {
        let held = fields
            .iter()
            .filter(|f| f.owner == holder && f.file.starts_with(CONCERNS_FOLDER))
            .filter(|f| !locks.contains(f));
        for field in held {
            for word in type_words(&field.ty) {
                if let Some(file) = declared.get(word)
                    && !found.iter().any(|(name, _)| name == word)
                {
                    found.push((word.to_owned(), (*file).to_owned()));
                    visit(word, fields, locks, declared, found);
                }
            }
        }
    }
    let mut found: Vec<(String, String)> = Vec::new();
    visit(owner, &fields, &locks, &declared, &mut found);
    found
}

/// ARCHITECTURE.md's section whose heading starts with `heading`, to the next `## `.
fn section<'a>(page: &'a str, heading: &str) -> &'a str {
    page.split(&format!("\n## {heading}"))
        .nth(1)
        .and_then(|rest| rest.split("\n## ").next())
        .unwrap_or_else(|| panic!("ARCHITECTURE.md has a section `## {heading}…`"))
}

/// The `Controller` methods a reconcile calls, in order: the steps ARCHITECTURE.md's claim path
/// must name. From `Controller::reconcile`, every `self.f(…)` in the body of a function of the
/// drivers (the file of `reconcile` and the file of the delete pipeline, `Deletes`) is a step
/// when `f` is a `Controller` method of the pipeline's files (the drivers and the files of the
/// concerns `Deletes` holds); a step in a driver file is followed in turn, where it is called
/// (depth first, calls in the order written); each step counts once, where first called. Each
/// comes with its file.
fn reconcile_steps(code: &[(String, String)]) -> Result<Vec<(String, String)>, String> {
    let methods: Vec<(String, &str, &str)> = code
        .iter()
        .filter(|(file, _)| file.starts_with(CONCERNS_FOLDER))
        .flat_map(|(file, code)| {
            methods(code, "Controller")
                .into_iter()
                .map(move |(name, body)| (name, file.as_str(), body))
        })
        .collect();
    let file_of = |name: &str| {
        methods
            .iter()
            .find(|(n, _, _)| n == name)
            .map(|(_, f, _)| *f)
    };
    let reconcile = file_of("reconcile")
        .ok_or("no `Controller::reconcile` under src/daemon/controller/: where does a reconcile start now? update this test")?;
    let pipeline = code
        .iter()
        .find(|(_, code)| structs(code).iter().any(|s| s.name == "Deletes"))
        .map(|(file, _)| file.as_str())
        .ok_or("no struct `Deletes` (the delete pipeline) in src/: update this test's drivers")?;
    let drivers = [reconcile, pipeline];
    let mut files: BTreeSet<String> = drivers.iter().map(|f| (*f).to_owned()).collect();
    files.extend(concerns(code, "Deletes").into_iter().map(|(_, file)| file));
    let mut steps: Vec<(String, String)> = Vec::new();
    fn follow<'a>(
        name: &str,
        methods: &[(String, &'a str, &'a str)],
        drivers: &[&str],
        files: &BTreeSet<String>,
        steps: &mut Vec<(String, String)>,
    ) {
        let Some((_, file, body)) = methods.iter().find(|(n, _, _)| n == name) else {
            return;
        };
        if !files.contains(*file) || steps.iter().any(|(n, _)| n == name) {
            return;
        }
        steps.push((name.to_owned(), (*file).to_owned()));
        if drivers.contains(file) {
            for call in self_calls(body) {
                follow(&call, methods, drivers, files, steps);
            }
        }
    }
    follow("reconcile", &methods, &drivers, &files, &mut steps);
    Ok(steps)
}

/// What ARCHITECTURE.md's claim path leaves out or names out of order, against `steps`
/// ([`reconcile_steps`]): each step must be named in the section (as `f`, `f()` or
/// `Controller::f`, with its own file as the span's file), and the order in which the section
/// first names the steps must be the order in which a reconcile first calls them. Naming a step
/// again later (to say where it comes back) is free.
fn path_gaps(path: &str, steps: &[(String, String)]) -> Vec<String> {
    let mut named: Vec<&str> = Vec::new();
    for block in blocks(path) {
        for (span, file) in spans_with_files(&block) {
            let Named::Item(item) = span else {
                continue;
            };
            let name = item.strip_prefix("Controller::").unwrap_or(item);
            let step = steps
                .iter()
                .find(|(n, f)| n == name && Some(f.as_str()) == file);
            if let Some((name, _)) = step
                && !named.contains(&name.as_str())
            {
                named.push(name);
            }
        }
    }
    let mut wrong = Vec::new();
    for (name, file) in steps {
        if !named.contains(&name.as_str()) {
            wrong.push(format!(
                "the claim path leaves out `{name}` ({file}), which a reconcile calls"
            ));
        }
    }
    let order: Vec<&str> = steps
        .iter()
        .map(|(n, _)| n.as_str())
        .filter(|n| named.contains(n))
        .collect();
    if let Some(at) = (0..order.len()).find(|&i| order[i] != named[i]) {
        wrong.push(format!(
            "the claim path first names `{}` where a reconcile first calls `{}`; a reconcile calls, in order: {}",
            named[at],
            order[at],
            steps
                .iter()
                .map(|(n, f)| format!("{f} `{n}`"))
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    wrong
}

/// What ARCHITECTURE.md's state section leaves out: each lock field of `src/` must be named in a
/// row of its table (`name: Type` as declared, whitespace aside, with its own file as the
/// span's file), and each concern ([`concerns`] of `Controller`) named in the section, prose or
/// table, with its own file.
fn state_gaps(state: &str, locks: &[Field], concerns: &[(String, String)]) -> Vec<String> {
    let blocks = blocks(state);
    let named = |row_only: bool| -> BTreeSet<(String, String)> {
        blocks
            .iter()
            .filter(|b| !row_only || b.starts_with('|'))
            .flat_map(|b| {
                spans_with_files(b)
                    .into_iter()
                    .filter_map(|(span, file)| match span {
                        Named::Field(text) | Named::Item(text) => {
                            Some((file?.to_owned(), squeeze(text)))
                        }
                        Named::Path(_) => None,
                    })
                    .collect::<Vec<_>>()
            })
            .collect()
    };
    let in_rows = named(true);
    let in_section = named(false);
    let mut wrong = Vec::new();
    for lock in locks {
        if !in_rows.contains(&(lock.file.clone(), lock.written())) {
            wrong.push(format!(
                "the state table leaves out the lock `{}: {}` of `{}` ({}): add it to its concern's row, its file named before it",
                lock.name, lock.ty, lock.owner, lock.file
            ));
        }
    }
    for (concern, file) in concerns {
        if !in_section.contains(&(file.clone(), concern.clone())) {
            wrong.push(format!(
                "the state section leaves out the concern `{concern}` ({file}), which the controller holds"
            ));
        }
    }
    wrong
}

/// The checks can fail: a lock, a concern or a step left out, a step out of order, a step named
/// with another file's function of the same name.
#[test]
fn a_map_that_leaves_something_out_is_reported() {
    let code = |files: &[(&str, &str)]| -> Vec<(String, String)> {
        files
            .iter()
            .map(|(f, c)| ((*f).to_owned(), code_of(c)))
            .collect()
    };
    let tree = code(&[
        (
            "src/daemon/controller/mod.rs",
            "struct Controller<C> { cluster: C, deletes: Deletes, notices: Notices }",
        ),
        (
            "src/daemon/controller/reconcile.rs",
            "impl<C> Controller<C> { async fn reconcile(&self) { self.resolve(); self.act() }\n\
             fn act(&self) { self.admit(); self.send(); self.report() } }",
        ),
        (
            "src/daemon/controller/delete.rs",
            "struct Deletes { slots: Slots }\n\
             impl<C> Controller<C> { fn admit(&self) {} fn send(&self) { self.mark() }\n\
             fn mark(&self) {} fn report(&self) { self.resolve(); self.tell() } }",
        ),
        (
            "src/daemon/controller/slots.rs",
            "pub type Shared = Mutex<u8>;\nstruct Slots { state: Arc<Shared>, n: u8 }\n\
             impl<C> Controller<C> { fn resolve(&self) {} }",
        ),
        (
            "src/daemon/controller/notices.rs",
            "struct Notices { told: tokio::sync::Mutex<Vec<u8>> }\n\
             impl<C> Controller<C> { fn tell(&self) {} }",
        ),
        (
            "src/cluster/clock.rs",
            "struct Shared { n: u8 }\nstruct Clock { shared: Arc<Shared> }",
        ),
    ]);
    let steps = reconcile_steps(&tree).expect("steps");
    let names: Vec<&str> = steps.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        [
            "reconcile",
            "resolve",
            "act",
            "admit",
            "send",
            "mark",
            "report"
        ],
        "notices' `tell` is no step: not of the pipeline's files"
    );
    let path = "1. `src/daemon/controller/reconcile.rs` `Controller::reconcile`: \
                `src/daemon/controller/slots.rs` `resolve`.\n\
                2. `src/daemon/controller/reconcile.rs` `act`, `src/daemon/controller/delete.rs` \
                `admit`, `send` and `mark()`, then `report`, which may call \
                `src/daemon/controller/slots.rs` `resolve` again.\n";
    assert_eq!(path_gaps(path, &steps), Vec::<String>::new());
    let misplaced = path.replace(
        "`send` and `mark()`, then `report`",
        "`send`, `report`, `mark`",
    );
    assert_eq!(
        path_gaps(&misplaced, &steps),
        [format!(
            "the claim path first names `report` where a reconcile first calls `mark`; a reconcile calls, in order: {}",
            steps
                .iter()
                .map(|(n, f)| format!("{f} `{n}`"))
                .collect::<Vec<_>>()
                .join(", ")
        )]
    );
    let omitted = path.replace("`src/daemon/controller/slots.rs` `resolve`.", "");
    let gaps = path_gaps(&omitted, &steps);
    assert!(
        gaps[0].starts_with(
            "the claim path first names `act` where a reconcile first calls `resolve`"
        ),
        "{gaps:?}"
    );
    // `resolve` named with another file is not the step.
    let elsewhere = path.replace("`src/daemon/controller/slots.rs` `resolve`.", "`resolve`.");
    assert!(
        path_gaps(&elsewhere, &steps)[0].starts_with("the claim path first names `act`"),
        "the span's file is reconcile.rs there"
    );
    let gone = path.replace("`mark()`", "marks");
    assert_eq!(
        path_gaps(&gone, &steps),
        [
            "the claim path leaves out `mark` (src/daemon/controller/delete.rs), which a reconcile calls"
        ]
    );

    let locks = lock_fields(&tree);
    let written: Vec<String> = locks.iter().map(Field::written).collect();
    assert_eq!(
        written,
        ["state:Arc<Shared>", "told:tokio::sync::Mutex<Vec<u8>>"],
        "a file's own `Shared` is not the lock alias of another file"
    );
    let held = concerns(&tree, "Controller");
    assert_eq!(
        held,
        [
            (
                "Deletes".to_owned(),
                "src/daemon/controller/delete.rs".to_owned()
            ),
            (
                "Slots".to_owned(),
                "src/daemon/controller/slots.rs".to_owned()
            ),
            (
                "Notices".to_owned(),
                "src/daemon/controller/notices.rs".to_owned()
            ),
        ]
    );
    let state = "The concerns: `src/daemon/controller/delete.rs` `Deletes`.\n\n\
                 | Concern | State |\n|---|---|\n\
                 | slots | `src/daemon/controller/slots.rs` `Slots`: `state: Arc<Shared>` |\n\
                 | notices | `src/daemon/controller/notices.rs` `Notices`: `told: tokio::sync::Mutex<Vec<u8>>` |\n";
    assert_eq!(state_gaps(state, &locks, &held), Vec::<String>::new());
    let one_lock_left = state.replace(": `told: tokio::sync::Mutex<Vec<u8>>`", "");
    assert_eq!(
        state_gaps(&one_lock_left, &locks, &held),
        [
            "the state table leaves out the lock `told: tokio::sync::Mutex<Vec<u8>>` of `Notices` (src/daemon/controller/notices.rs): add it to its concern's row, its file named before it"
        ]
    );
    let in_prose_only = state
        .replace("`Deletes`.", "`Deletes`, `state: Arc<Shared>`.")
        .replace(": `state: Arc<Shared>` |", " |");
    assert_eq!(
        state_gaps(&in_prose_only, &locks, &held).len(),
        1,
        "a lock belongs in a row"
    );
    let concern_left = state.replace("`Deletes`", "the pipeline");
    assert_eq!(
        state_gaps(&concern_left, &locks, &held),
        [
            "the state section leaves out the concern `Deletes` (src/daemon/controller/delete.rs), which the controller holds"
        ]
    );
}

/// ARCHITECTURE.md's lists are complete, read from the code. The state table ("Who owns which
/// state") names every lock field of `src/` (a field whose type holds `Mutex` or `RwLock`, std's
/// or tokio's, directly, wrapped, or through a type alias), as declared, in a row with its own
/// file; the section names every concern the `Controller` holds (a struct of
/// src/daemon/controller/ held in a field, not inside a lock, by the `Controller` or by a
/// concern) with its file. The claim path ("One claim") names every step a reconcile takes
/// ([`reconcile_steps`]) with its file, first named in the order a reconcile first calls them
/// ([`path_gaps`]). A failure says what to add, and where.
#[test]
fn the_architecture_lists_every_lock_concern_and_step() {
    let page =
        std::fs::read_to_string(Path::new(ROOT).join("ARCHITECTURE.md")).expect("ARCHITECTURE.md");
    let code = src_code();
    let locks = lock_fields(&code);
    let held = concerns(&code, "Controller");
    assert!(
        locks.len() > 10 && held.len() > 3,
        "the scan finds the locks and the concerns: {locks:?} {held:?}"
    );
    let mut wrong = state_gaps(section(&page, "Who owns which state"), &locks, &held);
    match reconcile_steps(&code) {
        Ok(steps) => wrong.extend(path_gaps(section(&page, "One claim"), &steps)),
        Err(why) => wrong.push(why.to_owned()),
    }
    assert!(
        wrong.is_empty(),
        "ARCHITECTURE.md leaves out what the code has; update the page:\n{}",
        wrong.join("\n")
    );
}

/// The module path of a source file of `src/`: `src/a/b.rs` and `src/a/b/mod.rs` are `a::b`.
fn module_of(file: &str) -> Vec<String> {
    let inner = file.trim_start_matches("src/").trim_end_matches(".rs");
    let mut path: Vec<String> = inner.split('/').map(str::to_owned).collect();
    if matches!(path.last().map(String::as_str), Some("mod" | "lib")) {
        path.pop();
    }
    path
}

/// Every path the code names from `crate::` or `super::`, braced groups expanded, made absolute
/// from `module`, the file's own module path (`super` of `a::b` is `a`, whether `b` is `b.rs`
/// or `b/mod.rs`).
fn paths_named(code: &str, module: &[String]) -> Vec<Vec<String>> {
    fn ident_end(text: &str) -> usize {
        text.find(|c: char| !(c.is_alphanumeric() || c == '_'))
            .unwrap_or(text.len())
    }
    // `text` follows `prefix::`: an identifier path, then maybe `::{group}`.
    fn expand(prefix: Vec<String>, text: &str, out: &mut Vec<Vec<String>>) {
        let mut path = prefix;
        let mut rest = text.trim_start();
        loop {
            if let Some(group) = rest.strip_prefix('{') {
                let Some(close) = closing_brace(group) else {
                    return;
                };
                let mut depth = 0;
                let mut start = 0;
                for (i, c) in group[..close].char_indices() {
                    match c {
                        '{' => depth += 1,
                        '}' => depth -= 1,
                        ',' if depth == 0 => {
                            expand(path.clone(), &group[start..i], out);
                            start = i + 1;
                        }
                        _ => {}
                    }
                }
                expand(path, &group[start..close], out);
                return;
            }
            let end = ident_end(rest);
            if end == 0 {
                break;
            }
            path.push(rest[..end].to_owned());
            rest = &rest[end..];
            match rest.strip_prefix("::") {
                Some(next) => rest = next.trim_start(),
                None => break,
            }
        }
        out.push(path);
    }
    fn closing_brace(text: &str) -> Option<usize> {
        let mut depth = 0;
        for (i, c) in text.char_indices() {
            match c {
                '{' => depth += 1,
                '}' if depth == 0 => return Some(i),
                '}' => depth -= 1,
                _ => {}
            }
        }
        None
    }
    let mut out = Vec::new();
    for (at, _) in code.match_indices("crate::") {
        let before = code[..at].chars().next_back();
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '$') {
            continue;
        }
        expand(Vec::new(), &code[at + "crate::".len()..], &mut out);
    }
    for (at, _) in code.match_indices("super::") {
        let before = code[..at].chars().next_back();
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
            continue;
        }
        let mut rest = &code[at..];
        let mut base = module.to_vec();
        while let Some(next) = rest.strip_prefix("super::") {
            base.pop();
            rest = next;
        }
        expand(base, rest, &mut out);
    }
    out
}

/// Which file of `files` (module paths) each named path lands in: its longest prefix that is
/// a file's module.
fn imports_by_file(code: &[(String, String)]) -> BTreeMap<String, BTreeSet<String>> {
    let modules: BTreeMap<Vec<String>, &str> = (code.iter())
        .map(|(file, _)| (module_of(file), file.as_str()))
        .collect();
    let mut imports = BTreeMap::new();
    for (file, text) in code {
        let mut targets = BTreeSet::new();
        for path in paths_named(text, &module_of(file)) {
            let landed = (1..=path.len())
                .rev()
                .find_map(|len| modules.get(&path[..len]));
            if let Some(target) = landed.filter(|target| **target != file.as_str()) {
                targets.insert((*target).to_owned());
            }
        }
        imports.insert(file.clone(), targets);
    }
    imports
}

/// The files that reach one another through their imports (every pair named once, in order).
fn import_circles(imports: &BTreeMap<String, BTreeSet<String>>) -> Vec<(String, String)> {
    let reach = |from: &String| {
        let mut seen = BTreeSet::new();
        let mut stack = vec![from.clone()];
        while let Some(file) = stack.pop() {
            for next in imports.get(&file).into_iter().flatten() {
                if seen.insert(next.clone()) {
                    stack.push(next.clone());
                }
            }
        }
        seen
    };
    let reached: BTreeMap<&String, BTreeSet<String>> =
        imports.keys().map(|file| (file, reach(file))).collect();
    let mut circles = Vec::new();
    for (a, from_a) in &reached {
        for b in from_a {
            if a.as_str() < b.as_str() && reached.get(b).is_some_and(|from_b| from_b.contains(*a)) {
                circles.push(((*a).clone(), b.clone()));
            }
        }
    }
    circles
}

#[test]
fn an_import_circle_is_found_through_braces_super_and_a_third_file() {
    let file = |name: &str, text: &str| (name.to_owned(), text.to_owned());
    let code = vec![
        file("src/lib.rs", "pub mod a; pub mod b;"),
        file("src/a/mod.rs", "use crate::{b::{x::Thing, y}, lib_item};"),
        file("src/b/x.rs", "use super::y::Other;"),
        file("src/b/y.rs", "fn f() { crate::a::run(); }"),
        file("src/c.rs", "use crate::a::Thing;"),
    ];
    let imports = imports_by_file(&code);
    assert_eq!(
        imports["src/a/mod.rs"],
        ["src/b/x.rs", "src/b/y.rs"].map(str::to_owned).into()
    );
    assert_eq!(imports["src/b/x.rs"], ["src/b/y.rs".to_owned()].into());
    let circles = import_circles(&imports);
    assert!(
        circles.contains(&("src/a/mod.rs".into(), "src/b/y.rs".into()))
            && circles.contains(&("src/a/mod.rs".into(), "src/b/x.rs".into())),
        "{circles:?}"
    );
    assert!(
        !circles
            .iter()
            .any(|(a, b)| a == "src/c.rs" || b == "src/c.rs"),
        "c imports the circle, nothing imports c back: {circles:?}"
    );
}

/// No file of `src/` imports another that imports it back, directly or through others
/// (issue 57): a circle hides which concern owns what. Paths named from `crate::` or
/// `super::` in code (comments, strings and tests blanked, so a doc link is no import) count.
#[test]
fn no_file_imports_a_file_that_imports_it_back() {
    let code = src_code();
    let imports = imports_by_file(&code);
    assert!(
        imports.values().map(BTreeSet::len).sum::<usize>() > 100,
        "the scan finds the imports: {imports:?}"
    );
    let circles = import_circles(&imports);
    assert!(
        circles.is_empty(),
        "files that import each other, directly or through others:\n{}",
        (circles.iter())
            .map(|(a, b)| format!("{a} <-> {b}"))
            .collect::<Vec<_>>()
            .join("\n")
    );
}
