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

/// What is wrong with the spans of `block`, read against `read` (a file's text, `None` when it
/// does not exist): each item and field is looked for in the nearest file named before it in
/// the block, else the first named after it.
fn wrong_spans(block: &str, read: &dyn Fn(&str) -> Option<String>) -> Vec<String> {
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
    let squeeze = |s: &str| s.chars().filter(|c| !c.is_whitespace()).collect::<String>();
    let mut wrong = Vec::new();
    for (i, span) in spans.iter().enumerate() {
        let file = files
            .iter()
            .rev()
            .find(|(at, _)| *at < i)
            .or_else(|| files.iter().find(|(at, _)| *at > i))
            .map(|(_, f)| *f);
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
