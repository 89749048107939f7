//! The documentation holds together: every relative link in README.md and docs/*.md names a
//! file that exists (and, with `#anchor`, a heading of that file), the README starts with the
//! two commands the project's contract puts first, and the README's first programs are the
//! files the test suite builds and runs.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

/// README.md and every page of docs/.
fn pages() -> Vec<PathBuf> {
    let mut pages = vec![root().join("README.md")];
    let docs = std::fs::read_dir(root().join("docs")).expect("docs/");
    for e in docs.flatten() {
        if e.path().extension().is_some_and(|x| x == "md") {
            pages.push(e.path());
        }
    }
    pages.sort();
    pages
}

/// The lines of `text` outside fenced code blocks.
fn outside_fences(text: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        } else if !fenced {
            out.push(line);
        }
    }
    out
}

/// The lines of `text` outside fenced code blocks, with inline code spans blanked out: a link
/// is only a link in prose.
fn prose(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in outside_fences(text) {
        let mut kept = String::new();
        for (i, part) in line.split('`').enumerate() {
            if i % 2 == 0 {
                kept.push_str(part);
            }
            kept.push(' ');
        }
        out.push(kept);
    }
    out
}

/// Targets of inline links `[text](target)` in `text`'s prose.
fn links(text: &str) -> Vec<String> {
    let mut found = Vec::new();
    for line in prose(text) {
        let mut rest = line.as_str();
        while let Some(i) = rest.find("](") {
            let after = &rest[i + 2..];
            let Some(end) = after.find(')') else { break };
            found.push(after[..end].trim().to_string());
            rest = &after[end..];
        }
    }
    found
}

/// The anchor GitHub gives a heading: lower case, punctuation dropped (but `-` and `_`),
/// spaces turned into `-`.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The anchors of `text`'s headings, a repeated one numbered as GitHub numbers it (`x`, `x-1`).
fn anchors(text: &str) -> HashSet<String> {
    let mut seen = HashSet::new();
    for line in outside_fences(text) {
        let hashes = line.chars().take_while(|&c| c == '#').count();
        if hashes == 0 || hashes > 6 || !line[hashes..].starts_with(' ') {
            continue;
        }
        let base = slug(line[hashes..].trim_end_matches(['#', ' ']));
        let mut anchor = base.clone();
        let mut n = 0;
        while !seen.insert(anchor.clone()) {
            n += 1;
            anchor = format!("{base}-{n}");
        }
    }
    seen
}

/// What is wrong with link `target` on page `page`, if anything.
fn dead(page: &Path, target: &str) -> Option<String> {
    if target.contains("://") || target.starts_with("mailto:") {
        return None;
    }
    let (path, anchor) = match target.split_once('#') {
        Some((p, a)) => (p, Some(a)),
        None => (target, None),
    };
    let file = if path.is_empty() {
        page.to_path_buf()
    } else {
        page.parent().expect("page directory").join(path)
    };
    if !file.exists() {
        return Some(format!("{} does not exist", file.display()));
    }
    let anchor = anchor?;
    if file.extension().is_none_or(|x| x != "md") {
        return Some(format!(
            "an anchor into {}, which is not markdown",
            file.display()
        ));
    }
    if anchors(&read(&file)).contains(anchor) {
        None
    } else {
        Some(format!("{} has no heading #{anchor}", file.display()))
    }
}

#[test]
fn every_relative_link_reaches_a_file_and_heading() {
    let mut checked = 0;
    let mut broken = Vec::new();
    for page in pages() {
        for target in links(&read(&page)) {
            checked += 1;
            if let Some(why) = dead(&page, &target) {
                broken.push(format!("{}: ({target}): {why}", page.display()));
            }
        }
    }
    assert!(broken.is_empty(), "dead links:\n{}", broken.join("\n"));
    assert!(checked >= 20, "only {checked} links found");
}

#[test]
fn the_link_check_itself() {
    let page = "# Top\n\n## From C (capi/)\n\n## Top\n\nSee [a](x.md#y) and `[b](c)`.\n\
                ```\n[d](e)\n```\n[f](g) (h)";
    assert_eq!(links(page), ["x.md#y", "g"]);
    let a = anchors(page);
    for want in ["top", "from-c-capi", "top-1"] {
        assert!(a.contains(want), "{want} not in {a:?}");
    }
    assert_eq!(
        slug("Large messages by RDMA read (on from 64 KiB)"),
        "large-messages-by-rdma-read-on-from-64-kib"
    );
    let readme = root().join("README.md");
    assert!(dead(&readme, "docs/settings.md").is_none());
    assert!(dead(&readme, "docs/settings.md#logging").is_none());
    assert!(dead(&readme, "docs/nothing.md").is_some());
    assert!(dead(&readme, "docs/settings.md#nothing").is_some());
    assert!(dead(&readme, "https://example.org/x.md").is_none());
}

#[test]
fn readme_starts_with_the_two_commands() {
    let readme = read(&root().join("README.md"));
    let first_block = readme
        .split("```sh\n")
        .nth(1)
        .and_then(|b| b.split("```").next())
        .expect("a sh block");
    let commands: Vec<_> = first_block
        .lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    assert_eq!(commands, ["scripts/demo.sh", "scripts/test.sh"]);
    let before: Vec<_> = readme[..readme.find("```sh").expect("sh")]
        .lines()
        .filter(|l| !l.trim().is_empty())
        .collect();
    assert_eq!(
        before,
        ["# xfabric"],
        "the README must open with the commands"
    );
    // .ci/run runs the README's test command.
    assert!(read(&root().join(".ci/run")).contains("scripts/test.sh"));
}

#[test]
fn readme_first_programs_are_the_tested_files() {
    let readme = read(&root().join("README.md"));
    for (lang, file) in [("rust", "examples/first.rs"), ("c", "capi/tests/c/first.c")] {
        let text = read(&root().join(file));
        assert!(
            readme.contains(&format!("```{lang}\n{text}```\n")),
            "README.md's {lang} block is not {file} as it is"
        );
    }
}
