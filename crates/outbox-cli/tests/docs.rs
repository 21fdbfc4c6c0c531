//! Docs that cannot drift from the code. Three checks, each over the Markdown of the repository
//! (README.md, CONTRIBUTING.md, CHANGELOG.md, docs/*.md, examples/*/README.md, deploy/README.md):
//!
//! 1. [`relative_links_resolve_inside_the_repository`]: every relative link names a file or
//!    folder that exists **inside** the repository (a link that climbs out of it, such as
//!    `../../shared/DESIGN.md`, fails even when the file happens to exist on this machine).
//! 2. [`commands_shown_in_the_docs_exist`]: every `outbox ...` line of a code block names real
//!    subcommands and flags, as the built binary's `-h` lists them.
//! 3. [`configuration_reference_matches_the_config_types`]: the key tables of
//!    docs/configuration.md list exactly the keys the configuration loader accepts, for every
//!    section and every source and sink kind; the TOML examples of the docs use only accepted
//!    keys.
//!
//! And [`versions_and_msrv_are_stated_once`]: one version and one minimum Rust version for
//! the workspace, stated in CHANGELOG.md and CONTRIBUTING.md.
//!
//! None of them needs a service: they read files and run `outbox -h` and
//! `outbox check-config`.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::path::{Component, Path, PathBuf};
use std::process::Command;

/// The workspace root (this crate is `crates/outbox-cli`).
fn root() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest
        .parent()
        .and_then(Path::parent)
        .expect("crates/outbox-cli has a workspace root")
        .to_path_buf()
}

/// The Markdown files the checks read: the top-level ones (which must exist), docs/*.md, and
/// each example's and deploy/'s README.
fn markdown_files() -> Vec<PathBuf> {
    let root = root();
    let mut files = Vec::new();
    for name in ["README.md", "CONTRIBUTING.md", "CHANGELOG.md"] {
        let path = root.join(name);
        assert!(path.is_file(), "{name} is missing from the repository");
        files.push(path);
    }
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .expect("docs/ is readable")
        .map(|e| e.expect("docs/ entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    files.extend(docs);
    let mut examples: Vec<PathBuf> = std::fs::read_dir(root.join("examples"))
        .expect("examples/ is readable")
        .map(|e| e.expect("examples/ entry").path().join("README.md"))
        .filter(|p| p.is_file())
        .collect();
    examples.sort();
    files.extend(examples);
    let deploy = root.join("deploy/README.md");
    if deploy.is_file() {
        files.push(deploy);
    }
    files
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
}

/// `path` relative to the workspace root, for messages.
fn shown(path: &Path) -> String {
    path.strip_prefix(root())
        .unwrap_or(path)
        .display()
        .to_string()
}

/// One line of a Markdown file and whether it sits inside a fenced code block (the fences
/// themselves count as code).
struct Line<'a> {
    number: usize,
    text: &'a str,
    code: bool,
    /// Index of the code block it belongs to (for blocks read as a whole).
    block: usize,
    /// The info string of its code block (`toml`, `sh`, ...), empty outside blocks.
    lang: &'a str,
}

fn lines(text: &str) -> Vec<Line<'_>> {
    let mut out = Vec::new();
    // The open fence: its character, its length and its info string.
    let mut fence: Option<(char, usize, &str)> = None;
    let mut block = 0;
    for (i, text) in text.lines().enumerate() {
        let trimmed = text.trim_start();
        let marker = trimmed.chars().next().filter(|c| *c == '`' || *c == '~');
        let run = marker.map_or(0, |c| trimmed.chars().take_while(|x| *x == c).count());
        let mut closes = false;
        match (fence, marker) {
            (None, Some(c)) if run >= 3 => {
                block += 1;
                fence = Some((c, run, trimmed[run..].trim()));
            }
            (Some((c, n, _)), Some(m)) => {
                closes = m == c && run >= n && trimmed[run..].trim().is_empty();
            }
            _ => {}
        }
        out.push(Line {
            number: i + 1,
            text,
            code: fence.is_some(),
            block: if fence.is_some() { block } else { 0 },
            lang: fence.map_or("", |(_, _, lang)| lang),
        });
        if closes {
            fence = None;
        }
    }
    out
}

/// `text` without its inline code spans (`` `like this` ``).
fn without_code_spans(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < chars.len() {
        if chars[i] != '`' {
            out.push(chars[i]);
            i += 1;
            continue;
        }
        let run = chars[i..].iter().take_while(|c| **c == '`').count();
        // The closing run of exactly as many backticks, if any.
        let mut j = i + run;
        let mut close = None;
        while j < chars.len() {
            if chars[j] == '`' {
                let r = chars[j..].iter().take_while(|c| **c == '`').count();
                if r == run {
                    close = Some(j + r);
                    break;
                }
                j += r;
            } else {
                j += 1;
            }
        }
        match close {
            Some(end) => i = end,
            None => {
                out.extend(&chars[i..i + run]);
                i += run;
            }
        }
    }
    out
}

/// The link targets of one line of prose: `[text](target "title")`, `![alt](target)`,
/// reference definitions `[id]: target`, and HTML `href="..."` / `src="..."`.
fn link_targets(line: &str) -> Vec<String> {
    let mut targets = Vec::new();
    let mut rest = line;
    while let Some(at) = rest.find("](") {
        let after = &rest[at + 2..];
        // Up to the `)` that closes the link (a target may hold balanced parentheses).
        let mut depth = 0usize;
        let mut end = after.len();
        for (i, c) in after.char_indices() {
            match c {
                '(' => depth += 1,
                ')' if depth == 0 => {
                    end = i;
                    break;
                }
                ')' => depth -= 1,
                _ => {}
            }
        }
        let inside = after[..end].trim();
        let target = match inside.strip_prefix('<') {
            Some(t) => t.split('>').next().unwrap_or_default(),
            None => inside.split_whitespace().next().unwrap_or_default(),
        };
        if !target.is_empty() {
            targets.push(target.to_owned());
        }
        rest = &after[end..];
    }
    let trimmed = line.trim_start();
    if let Some(def) = trimmed.strip_prefix('[')
        && let Some((label, target)) = def.split_once("]:")
        && !label.is_empty()
        && !label.contains('[')
        && let Some(target) = target.split_whitespace().next()
    {
        targets.push(target.trim_matches(['<', '>']).to_owned());
    }
    for attribute in ["href=\"", "src=\""] {
        let mut rest = line;
        while let Some(at) = rest.find(attribute) {
            let after = &rest[at + attribute.len()..];
            let value = after.split('"').next().unwrap_or_default();
            targets.push(value.to_owned());
            rest = &after[value.len()..];
        }
    }
    targets
}

/// `path` with `.` and `..` resolved lexically, as a browser resolves a link: `../../x` from
/// docs/ leaves the repository whatever exists beside it on this machine.
fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            Component::ParentDir => {
                if !out.pop() {
                    out.push("..");
                }
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

/// Why a relative link `target` in `file` is broken, if it is.
fn broken_link(root: &Path, file: &Path, target: &str) -> Option<String> {
    let lower = target.to_ascii_lowercase();
    if lower.starts_with("http://")
        || lower.starts_with("https://")
        || lower.starts_with("mailto:")
        || target.starts_with('#')
    {
        return None;
    }
    if target.contains("://") {
        return Some("a link with a scheme other than http(s) or mailto".into());
    }
    let path = target.split(['#', '?']).next().unwrap_or_default();
    if path.is_empty() {
        return None;
    }
    let path = path.replace("%20", " ");
    let resolved = match path.strip_prefix('/') {
        Some(from_root) => root.join(from_root),
        None => file.parent().expect("a file has a folder").join(&path),
    };
    let resolved = normalize(&resolved);
    if !resolved.starts_with(root) {
        return Some(format!(
            "points outside the repository ({}): a clone does not have it",
            resolved.display()
        ));
    }
    if !resolved.exists() {
        return Some(format!("no such file: {}", shown(&resolved)));
    }
    None
}

#[test]
fn relative_links_resolve_inside_the_repository() {
    let root = normalize(&root());
    let mut broken = Vec::new();
    let mut checked = 0;
    for file in markdown_files() {
        let file = normalize(&file);
        let text = read(&file);
        for line in lines(&text).iter().filter(|l| !l.code) {
            for target in link_targets(&without_code_spans(line.text)) {
                checked += 1;
                if let Some(why) = broken_link(&root, &file, &target) {
                    broken.push(format!(
                        "{}:{}: `{target}`: {why}",
                        shown(&file),
                        line.number
                    ));
                }
            }
        }
    }
    assert!(
        checked > 100,
        "only {checked} links found: is the parser broken?"
    );
    assert!(
        broken.is_empty(),
        "{} broken relative link(s):\n{}",
        broken.len(),
        broken.join("\n")
    );
}

// ---------------------------------------------------------------------------------------
// Commands

/// Runs the built binary with the environment emptied of everything but `PATH` and `HOME`
/// (no `OUTBOX_*` variable of the developer's shell can change what it accepts), in `dir`.
fn outbox(args: &[&str], dir: &Path) -> std::process::Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_outbox"));
    command.args(args).current_dir(dir).env_clear();
    for keep in ["PATH", "HOME"] {
        if let Some(value) = std::env::var_os(keep) {
            command.env(keep, value);
        }
    }
    command
        .output()
        .unwrap_or_else(|e| panic!("cannot run outbox {args:?}: {e}"))
}

/// What `outbox <path> -h` says about one (sub)command.
#[derive(Debug, Default)]
struct Help {
    subcommands: BTreeSet<String>,
    /// Flag (`--json`, `-c`) → whether it takes a value.
    flags: BTreeMap<String, bool>,
}

fn parse_help(text: &str) -> Help {
    let mut help = Help::default();
    let mut in_commands = false;
    for line in text.lines() {
        if line.trim().is_empty() {
            in_commands = false;
            continue;
        }
        if !line.starts_with(' ') {
            in_commands = line.trim_end() == "Commands:";
            continue;
        }
        let trimmed = line.trim_start();
        if in_commands {
            if let Some(name) = trimmed.split_whitespace().next() {
                help.subcommands.insert(name.to_owned());
            }
            continue;
        }
        if !trimmed.starts_with('-') {
            continue;
        }
        // `-c, --config <CONFIG>  ...`, `    --json  ...`, `--log-format <LOG_FORMAT>`
        let mut words = trimmed.split_whitespace().peekable();
        let mut names = Vec::new();
        while let Some(word) = words.next_if(|w| w.starts_with('-')) {
            names.push(word.trim_end_matches(',').to_owned());
        }
        let takes_value = words
            .peek()
            .is_some_and(|w| w.starts_with('<') || w.starts_with("[<"));
        for name in names {
            help.flags.insert(name, takes_value);
        }
    }
    help
}

/// Splits a shell line into words: whitespace outside quotes separates, quotes are kept
/// out, a `#` that starts a word starts a comment.
fn shell_words(line: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut word = String::new();
    let mut quote: Option<char> = None;
    let mut in_word = false;
    for c in line.chars() {
        match quote {
            Some(q) if c == q => quote = None,
            Some(_) => word.push(c),
            None if c == '\'' || c == '"' => {
                quote = Some(c);
                in_word = true;
            }
            None if c.is_whitespace() => {
                if in_word {
                    words.push(std::mem::take(&mut word));
                    in_word = false;
                }
            }
            None if c == '#' && !in_word => break,
            None => {
                word.push(c);
                in_word = true;
            }
        }
    }
    if in_word {
        words.push(word);
    }
    words
}

/// The `outbox` command lines of the code blocks of `text`, with their line numbers: lines
/// starting with `outbox ` (or `$ outbox `; in a block that has `$ ` prompts, only those,
/// since the other lines are output), joined over trailing backslashes, split at `&&`, `;`
/// and `&`. Environment assignments before `outbox` are skipped.
fn command_lines(text: &str) -> Vec<(usize, Vec<String>)> {
    let all = lines(text);
    let prompts: HashSet<usize> = all
        .iter()
        .filter(|l| l.code && l.text.trim_start().starts_with("$ "))
        .map(|l| l.block)
        .collect();
    let mut commands = Vec::new();
    let mut i = 0;
    while i < all.len() {
        let line = &all[i];
        i += 1;
        if !line.code {
            continue;
        }
        let mut text = line.text.trim_start();
        if prompts.contains(&line.block) {
            let Some(command) = text.strip_prefix("$ ") else {
                continue;
            };
            text = command;
        }
        let mut joined = text.to_owned();
        while joined.trim_end().ends_with('\\') && i < all.len() && all[i].code {
            joined = format!(
                "{} {}",
                joined.trim_end().trim_end_matches('\\'),
                all[i].text
            );
            i += 1;
        }
        let mut words = shell_words(&joined).into_iter().peekable();
        // Skip `NAME=value` assignments in front of the command.
        while words.next_if(|w| is_assignment(w)).is_some() {}
        if words.peek().map(String::as_str) != Some("outbox") {
            continue;
        }
        let mut current: Option<Vec<String>> = None;
        for word in words {
            match word.as_str() {
                "&&" | ";" | "&" => {
                    if let Some(done) = current.take() {
                        commands.push((line.number, done));
                    }
                }
                "outbox" if current.is_none() => current = Some(Vec::new()),
                _ => {
                    if let Some(args) = current.as_mut() {
                        args.push(word);
                    }
                }
            }
        }
        if let Some(done) = current {
            commands.push((line.number, done));
        }
    }
    commands
}

fn is_assignment(word: &str) -> bool {
    word.split_once('=').is_some_and(|(name, _)| {
        !name.is_empty()
            && name
                .chars()
                .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
    })
}

/// Why `args` (the words after `outbox`) is not a command the binary has, if it is not.
/// Placeholder syntax is understood: `[--flag VALUE]` (optional), `a|b` (alternatives: each
/// must be a subcommand), `...` and a lone `|`.
fn check_command(args: &[String], help_of: &mut impl FnMut(&[String]) -> Help) -> Option<String> {
    let mut path: Vec<String> = Vec::new();
    let mut help = help_of(&path);
    let mut positional = false;
    let mut words = args.iter().map(|w| w.trim_matches(['[', ']'])).peekable();
    while let Some(word) = words.next() {
        if word.is_empty() || word == "|" || word == "..." {
            continue;
        }
        if word.starts_with('-') && word.len() > 1 {
            let name = word.split('=').next().unwrap_or(word);
            match help.flags.get(name) {
                None => {
                    return Some(format!(
                        "`outbox {}` has no flag `{name}` (it has: {})",
                        path.join(" "),
                        help.flags.keys().cloned().collect::<Vec<_>>().join(", ")
                    ));
                }
                Some(true) if !word.contains('=') => {
                    words.next();
                }
                Some(_) => {}
            }
            continue;
        }
        if positional || help.subcommands.is_empty() {
            positional = true;
            continue;
        }
        let alternatives: Vec<&str> = word.split('|').collect();
        for alternative in &alternatives {
            if !help.subcommands.contains(*alternative) {
                return Some(format!(
                    "`outbox {}` has no subcommand `{alternative}` (it has: {})",
                    path.join(" "),
                    help.subcommands
                        .iter()
                        .cloned()
                        .collect::<Vec<_>>()
                        .join(", ")
                ));
            }
        }
        if alternatives.len() > 1 {
            // Which one the flags after it belong to is not said: stop here.
            return None;
        }
        path.push(word.to_owned());
        help = help_of(&path);
    }
    None
}

#[test]
fn commands_shown_in_the_docs_exist() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cache: HashMap<Vec<String>, String> = HashMap::new();
    let mut help_of = |path: &[String]| {
        let text = cache.entry(path.to_vec()).or_insert_with(|| {
            let mut args: Vec<&str> = path.iter().map(String::as_str).collect();
            args.push("-h");
            let out = outbox(&args, dir.path());
            assert!(out.status.success(), "outbox {args:?} failed: {out:?}");
            String::from_utf8(out.stdout).expect("help is UTF-8")
        });
        parse_help(text)
    };
    // The parser must see the real CLI: a top-level subcommand and a global flag.
    let top = help_of(&[]);
    assert!(
        top.subcommands.contains("relay") && top.flags.get("--config") == Some(&true),
        "cannot read `outbox -h`: {top:?}"
    );

    let mut wrong = Vec::new();
    let mut checked = 0;
    for file in markdown_files() {
        for (number, args) in command_lines(&read(&file)) {
            checked += 1;
            if let Some(why) = check_command(&args, &mut help_of) {
                wrong.push(format!(
                    "{}:{number}: `outbox {}`: {why}",
                    shown(&file),
                    args.join(" ")
                ));
            }
        }
    }
    assert!(
        checked > 20,
        "only {checked} command lines found: is the parser broken?"
    );
    assert!(
        wrong.is_empty(),
        "{} command line(s) in the docs do not match the CLI:\n{}",
        wrong.len(),
        wrong.join("\n")
    );
}

// ---------------------------------------------------------------------------------------
// Configuration keys
//
// How the two sides are obtained, and why this way:
//
// - **Accepted keys** come from the real loader, never from a list kept here. Every config
//   type is `#[serde(deny_unknown_fields)]`, and the loader's error for an unknown key lists
//   the keys the type accepts (serde's own field list, which `outbox check-config` prints as
//   ``unknown key `zz_probe` (expected one of: a, b, c)``). So for each section, and for each
//   source and sink kind, the test writes a config with one made-up key, runs `outbox
//   check-config` on it, and reads the list. The kinds themselves come the same way (an
//   unknown `kind` value lists the known ones). A new field, kind or section shows up without
//   touching this test; parsing the Rust sources instead would miss macros, renames and
//   feature gates, and a schema derive would add a dependency to every config type. A nested
//   table (`relay.backoff`) is probed the same way; one that takes any key (`sink.settings`,
//   `headers`) answers without an unknown-key error and is treated as free-form.
// - **Documented keys** are the first cells of the `| key | ... |` tables of
//   docs/configuration.md, under `## [section]` headings, and for `[source]` and `[sink]`
//   under `### kind = "..."` headings (a heading may name several kinds; a key may be
//   restricted to some of them with a parenthesised `(`kind`)`). Dotted keys
//   (`backoff.initial`) belong to the nested table. The table of `## [source]` and
//   `## [sink]` holds the keys every kind has.
//
// Checked: every accepted key is documented, every documented key is accepted, every kind is
// documented (with a heading, and in the `kind` row), every section is documented, and every
// key of every TOML example in the docs is accepted.

/// The secret keys that may come from a file (`KEY_file`), and where: the loader reads these
/// before serde sees the section (crates/outbox-runtime/src/config.rs), so no probe lists them.
const SECRET_FILE_KEYS: [&str; 4] = ["url", "token", "secret", "nkey_seed"];
const SECRET_FILE_SECTIONS: [&str; 4] = ["source", "sink", "sinks", "ui"];

/// A made-up key no config type has.
const PROBE: &str = "zz_probe";

/// What the loader says about a config with [`PROBE`] in it: `Some(keys)` when it refused the
/// probe as an unknown key (the keys it accepts there), `None` when it took it (a free-form
/// table).
struct Loader {
    dir: tempfile::TempDir,
    cache: HashMap<String, Option<BTreeSet<String>>>,
}

impl Loader {
    fn new() -> Self {
        Self {
            dir: tempfile::tempdir().expect("tempdir"),
            cache: HashMap::new(),
        }
    }

    /// The stderr of `outbox check-config` on `toml`, or `None` when it accepted it.
    fn check(&self, toml: &str) -> Option<String> {
        let file = self.dir.path().join("probe.toml");
        std::fs::write(&file, toml).expect("write the probe config");
        let out = outbox(&["check-config", "--config", "probe.toml"], self.dir.path());
        (!out.status.success()).then(|| String::from_utf8_lossy(&out.stderr).into_owned())
    }

    /// The list after ``unknown {what} `zz_probe` (expected one of: `` in the loader's error.
    fn expected(&self, toml: &str, what: &str) -> Option<BTreeSet<String>> {
        let error = self.check(toml)?;
        let marker = format!("unknown {what} `{PROBE}` (expected one of: ");
        let start = error.find(&marker).map(|at| at + marker.len())?;
        let list = &error[start..];
        let list = &list[..list.find(')').unwrap_or(list.len())];
        Some(
            list.split(',')
                .map(|k| k.trim().trim_matches('`').to_owned())
                .filter(|k| !k.is_empty())
                .collect(),
        )
    }

    /// The keys accepted in the table that `prefix` (TOML lines) opens, with the probe added
    /// to it; `None` when the table takes any key.
    fn keys(&mut self, prefix: &str) -> Option<BTreeSet<String>> {
        if let Some(hit) = self.cache.get(prefix) {
            return hit.clone();
        }
        // Any other outcome than an unknown-key error means serde took the probe: the config
        // may still fail later (a missing required key, a librdkafka setting refused by
        // librdkafka), but the table itself takes any key.
        let keys = self.expected(&format!("{prefix}\n{PROBE} = 1\n"), "key");
        self.cache.insert(prefix.to_owned(), keys.clone());
        keys
    }

    /// The `kind` values of `[section]`.
    fn kinds(&self, section: &str) -> BTreeSet<String> {
        self.expected(&format!("[{section}]\nkind = \"{PROBE}\"\n"), "value")
            .unwrap_or_else(|| panic!("the loader did not list the kinds of [{section}]"))
    }
}

/// Where a documented key belongs: `source/postgres`, `sink/*` (every sink kind), `relay`,
/// `relay.backoff`, `subscription`, ...
type Context = String;

/// The documented keys of docs/configuration.md: context → key → the line documenting it.
#[derive(Debug, Default)]
struct Documented {
    keys: BTreeMap<Context, BTreeMap<String, usize>>,
    /// `[source]` / `[sink]` kinds with a `### kind = "..."` heading.
    kind_headings: BTreeMap<String, BTreeSet<String>>,
    /// The meaning cell of the `kind` row of `[source]` / `[sink]`.
    kind_rows: BTreeMap<String, String>,
    /// Every section with a `## [...]` heading.
    sections: BTreeSet<String>,
}

/// The backticked words of a Markdown table cell, split into those outside parentheses (the
/// keys) and inside them (annotations such as a kind).
fn cell_words(cell: &str) -> (Vec<String>, Vec<String>) {
    let (mut outside, mut inside) = (Vec::new(), Vec::new());
    let mut depth = 0usize;
    let mut chars = cell.chars();
    while let Some(c) = chars.next() {
        match c {
            '(' => depth += 1,
            ')' => depth = depth.saturating_sub(1),
            '`' => {
                let word: String = chars.by_ref().take_while(|c| *c != '`').collect();
                if depth == 0 {
                    &mut outside
                } else {
                    &mut inside
                }
                .push(word);
            }
            _ => {}
        }
    }
    (outside, inside)
}

fn cells(row: &str) -> Vec<&str> {
    let row = row.trim().trim_start_matches('|').trim_end_matches('|');
    row.split('|').map(str::trim).collect()
}

/// The section names of a `## ...` heading: `[source]` → `source`, `[[subscription]]` →
/// `subscription`, `[sinks.NAME]` → `sinks`.
fn heading_sections(heading: &str) -> Vec<String> {
    cell_words(heading)
        .0
        .into_iter()
        .filter(|w| w.starts_with('['))
        .map(|w| {
            let name = w.trim_matches(['[', ']']);
            name.split('.').next().unwrap_or(name).to_owned()
        })
        .collect()
}

/// The kinds a `### kind = "a"`, `"b"` heading names.
fn heading_kinds(heading: &str) -> Vec<String> {
    if !heading.contains("kind = ") {
        return Vec::new();
    }
    heading
        .split('"')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect()
}

fn documented(text: &str) -> Documented {
    let mut doc = Documented::default();
    let mut sections: Vec<String> = Vec::new();
    let mut kinds: Vec<String> = Vec::new();
    let mut in_table = false;
    for line in lines(text) {
        if line.code {
            in_table = false;
            continue;
        }
        if let Some(heading) = line.text.strip_prefix("## ") {
            sections = heading_sections(heading);
            doc.sections.extend(sections.iter().cloned());
            kinds.clear();
            in_table = false;
            continue;
        }
        if let Some(heading) = line.text.strip_prefix("### ") {
            kinds = heading_kinds(heading);
            if let [section] = sections.as_slice() {
                doc.kind_headings
                    .entry(section.clone())
                    .or_default()
                    .extend(kinds.iter().cloned());
            }
            in_table = false;
            continue;
        }
        if !line.text.trim_start().starts_with('|') {
            in_table = false;
            continue;
        }
        let row = cells(line.text);
        if row.first() == Some(&"key") {
            in_table = true;
            continue;
        }
        if !in_table || row.first().is_some_and(|c| c.starts_with("---")) {
            continue;
        }
        let (keys, annotations) = cell_words(row[0]);
        for key in keys.iter().filter(|k| !k.starts_with('[')) {
            // The full dotted path of the key.
            let path = match sections.as_slice() {
                [section] => format!("{section}.{key}"),
                _ => {
                    assert!(
                        sections.iter().any(|s| key.starts_with(&format!("{s}."))),
                        "docs/configuration.md:{}: `{key}` under a heading of several sections must name its section (`subscription.name`)",
                        line.number
                    );
                    key.clone()
                }
            };
            let (table, key) = path.rsplit_once('.').expect("a dotted path");
            let contexts: Vec<Context> = match (table, kinds.is_empty()) {
                ("source" | "sink", true) => {
                    if key == "kind" {
                        doc.kind_rows.insert(
                            table.to_owned(),
                            row.get(2).or(row.get(1)).unwrap_or(&"").to_string(),
                        );
                    }
                    vec![format!("{table}/*")]
                }
                ("source" | "sink", false) => {
                    let only: Vec<&String> =
                        annotations.iter().filter(|a| kinds.contains(a)).collect();
                    kinds
                        .iter()
                        .filter(|k| only.is_empty() || only.contains(k))
                        .map(|k| format!("{table}/{k}"))
                        .collect()
                }
                _ => vec![table.to_owned()],
            };
            for context in contexts {
                doc.keys
                    .entry(context)
                    .or_default()
                    .insert(key.to_owned(), line.number);
            }
        }
    }
    doc
}

/// The TOML that opens `context` for a probe: `source/postgres` → `[source]\nkind = "postgres"`,
/// `relay.backoff` → `[relay.backoff]`, `subscription` → `[[subscription]]`.
fn opening(context: &str) -> String {
    if let Some((section, kind)) = context.split_once('/') {
        return format!("[{section}]\nkind = \"{kind}\"");
    }
    match context {
        "subscription" | "capture" => format!("[[{context}]]"),
        _ => format!("[{context}]"),
    }
}

#[cfg(all(
    feature = "nats",
    feature = "http",
    feature = "kafka",
    feature = "redis",
    feature = "rabbitmq",
    feature = "sqs",
    feature = "sns",
    feature = "kinesis",
    feature = "pubsub"
))]
#[test]
fn configuration_reference_matches_the_config_types() {
    let mut loader = Loader::new();
    let doc = documented(&read(&root().join("docs/configuration.md")));
    let mut wrong = Vec::new();

    // Sections: the top level accepts exactly the documented ones.
    let sections = loader.keys("").expect("the top level refuses unknown keys");
    for section in sections.symmetric_difference(&doc.sections) {
        wrong.push(if sections.contains(section) {
            format!("section `{section}` is accepted but has no `## [{section}]` heading")
        } else {
            format!("section `{section}` has a heading but is not accepted")
        });
    }

    // Every probed context: the section itself, each source and sink kind, and each nested
    // table the docs have dotted keys for.
    let mut contexts: BTreeMap<Context, BTreeSet<String>> = BTreeMap::new();
    for section in ["source", "sink"] {
        let kinds = loader.kinds(section);
        let headings = doc.kind_headings.get(section).cloned().unwrap_or_default();
        for kind in kinds.symmetric_difference(&headings) {
            wrong.push(if kinds.contains(kind) {
                format!("[{section}] kind `{kind}` is accepted but has no `### kind = \"{kind}\"` heading")
            } else {
                format!("[{section}] kind `{kind}` has a heading but is not accepted")
            });
        }
        let row = doc.kind_rows.get(section).cloned().unwrap_or_default();
        for kind in &kinds {
            if !row.contains(&format!("`{kind}`")) {
                wrong.push(format!(
                    "the `kind` row of [{section}] does not name `{kind}`: {row}"
                ));
            }
        }
        for kind in kinds {
            let context = format!("{section}/{kind}");
            let mut keys = loader
                .keys(&opening(&context))
                .expect("a kind refuses unknown keys");
            keys.insert("kind".to_owned());
            contexts.insert(context, keys);
        }
    }
    for section in &sections {
        if section == "source" || section == "sink" || section == "sinks" {
            continue;
        }
        let keys = loader
            .keys(&opening(section))
            .expect("a section refuses unknown keys");
        contexts.insert(section.clone(), keys);
    }
    for context in doc.keys.keys().filter(|c| c.contains('.')) {
        match loader.keys(&opening(context)) {
            Some(keys) => {
                contexts.insert(context.clone(), keys);
            }
            None => wrong.push(format!(
                "`{context}` takes any key, yet its keys are documented one by one"
            )),
        }
    }
    // `[sinks.NAME]` takes what `[sink]` takes.
    assert_eq!(
        loader.keys("[sinks.probe]\nkind = \"stdout\""),
        contexts
            .get("sink/stdout")
            .map(|k| k.iter().filter(|k| *k != "kind").cloned().collect()),
        "[sinks.NAME] and [sink] accept different keys"
    );

    // Accepted → documented.
    let none = BTreeMap::new();
    for (context, accepted) in &contexts {
        let mut documented: BTreeSet<&String> =
            doc.keys.get(context).unwrap_or(&none).keys().collect();
        if let Some((section, _)) = context.split_once('/') {
            documented.extend(
                doc.keys
                    .get(&format!("{section}/*"))
                    .unwrap_or(&none)
                    .keys(),
            );
        }
        // A nested table documented by its dotted keys documents its own name.
        let nested: Vec<String> = doc
            .keys
            .keys()
            .filter_map(|c| c.strip_prefix(&format!("{context}.")))
            .map(str::to_owned)
            .collect();
        for key in accepted {
            if !documented.contains(key) && !nested.contains(key) {
                wrong.push(format!(
                    "`{context}` accepts `{key}`, which docs/configuration.md does not list"
                ));
            }
        }
    }
    // Documented → accepted.
    for (context, keys) in &doc.keys {
        let targets: Vec<(&Context, &BTreeSet<String>)> = match context.strip_suffix("/*") {
            // A key of the section's own table: every kind must take it.
            Some(section) => contexts
                .iter()
                .filter(|(c, _)| c.strip_prefix(section).is_some_and(|k| k.starts_with('/')))
                .collect(),
            None => match contexts.get_key_value(context) {
                Some(found) => vec![found],
                None => {
                    wrong.push(format!("docs/configuration.md documents keys of `{context}`, which the loader does not know"));
                    continue;
                }
            },
        };
        for (key, line) in keys {
            for (target, accepted) in &targets {
                if !accepted.contains(key) {
                    wrong.push(format!(
                        "docs/configuration.md:{line}: `{key}` is documented for `{context}`, but `{target}` does not accept it"
                    ));
                }
            }
        }
    }

    // The TOML examples of the docs use accepted keys only.
    for file in markdown_files() {
        wrong.extend(check_toml_examples(&file, &mut loader, &contexts));
    }

    assert!(
        contexts.len() > 15 && doc.keys.len() > 15,
        "too few contexts found: is the parser broken?\naccepted: {contexts:?}\ndocumented: {:?}",
        doc.keys
    );
    assert!(
        wrong.is_empty(),
        "docs/configuration.md and the config types disagree ({}):\n{}",
        wrong.len(),
        wrong.join("\n")
    );
}

/// The keys of every ```toml block of `file` that the loader would refuse. A `[source]` or
/// `[sink]` table without `kind` takes the kind of the `### kind = "..."` heading above it.
fn check_toml_examples(
    file: &Path,
    loader: &mut Loader,
    contexts: &BTreeMap<Context, BTreeSet<String>>,
) -> Vec<String> {
    let text = read(file);
    let mut blocks: BTreeMap<usize, (usize, String, Vec<String>)> = BTreeMap::new();
    let mut kinds: Vec<String> = Vec::new();
    for line in lines(&text) {
        if !line.code {
            if let Some(heading) = line.text.strip_prefix("### ") {
                kinds = heading_kinds(heading);
            } else if line.text.starts_with("## ") {
                kinds.clear();
            }
            continue;
        }
        if line.lang != "toml" {
            continue;
        }
        let entry = blocks
            .entry(line.block)
            .or_insert_with(|| (line.number, String::new(), kinds.clone()));
        if !line.text.trim_start().starts_with("```") && !line.text.trim_start().starts_with("~~~")
        {
            entry.1.push_str(line.text);
            entry.1.push('\n');
        }
    }
    let mut wrong = Vec::new();
    for (number, body, heading_kinds) in blocks.into_values() {
        let at = format!("{}:{number}", shown(file));
        let table: toml::Table = match body.parse() {
            Ok(t) => t,
            Err(e) => {
                wrong.push(format!("{at}: the TOML example does not parse: {e}"));
                continue;
            }
        };
        let kind_of = |t: &toml::Table| {
            t.get("kind")
                .and_then(toml::Value::as_str)
                .map(str::to_owned)
                .or_else(|| (heading_kinds.len() == 1).then(|| heading_kinds[0].clone()))
        };
        // Each table of the example with the context its keys belong to.
        let mut tables: Vec<(String, &toml::Table)> = Vec::new();
        for (section, value) in &table {
            match (section.as_str(), value) {
                ("source" | "sink", toml::Value::Table(t)) => match kind_of(t) {
                    Some(kind) => tables.push((format!("{section}/{kind}"), t)),
                    None => wrong.push(format!(
                        "{at}: [{section}] without `kind` (and no `### kind` heading above)"
                    )),
                },
                ("sinks", toml::Value::Table(named)) => {
                    for sink in named.values() {
                        match sink.as_table().and_then(|t| Some((kind_of(t)?, t))) {
                            Some((kind, t)) => tables.push((format!("sink/{kind}"), t)),
                            None => wrong.push(format!("{at}: a [sinks.NAME] without `kind`")),
                        }
                    }
                }
                (_, toml::Value::Table(t)) => tables.push((section.clone(), t)),
                (_, toml::Value::Array(entries)) => {
                    tables.extend(
                        entries
                            .iter()
                            .filter_map(|e| Some((section.clone(), e.as_table()?))),
                    );
                }
                _ => wrong.push(format!("{at}: `{section}` is not a section")),
            }
        }
        for (context, t) in tables {
            check_table(&at, &context, t, loader, contexts, &mut wrong);
        }
    }
    wrong
}

fn check_table(
    at: &str,
    context: &str,
    table: &toml::Table,
    loader: &mut Loader,
    contexts: &BTreeMap<Context, BTreeSet<String>>,
    wrong: &mut Vec<String>,
) {
    let Some(accepted) = contexts.get(context) else {
        wrong.push(format!(
            "{at}: `{context}` is not a section or kind the loader knows"
        ));
        return;
    };
    let section = context.split(['/', '.']).next().unwrap_or(context);
    for (key, value) in table {
        let from_file = key.strip_suffix("_file").is_some_and(|stem| {
            SECRET_FILE_KEYS.contains(&stem) && SECRET_FILE_SECTIONS.contains(&section)
        });
        if !accepted.contains(key) && !from_file {
            wrong.push(format!("{at}: `{key}` is not accepted in `{context}`"));
            continue;
        }
        // A nested table: check its keys too, unless it takes any key.
        if let toml::Value::Table(inner) = value {
            let nested = format!("{context}.{key}");
            let opening = match context.split_once('/') {
                Some((section, kind)) => {
                    format!("[{section}]\nkind = \"{kind}\"\n[{section}.{key}]")
                }
                None => format!("[{nested}]"),
            };
            if let Some(keys) = loader.keys(&opening) {
                for inner_key in inner.keys().filter(|k| !keys.contains(*k)) {
                    wrong.push(format!("{at}: `{inner_key}` is not accepted in `{nested}`"));
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// Versions

/// One version and one minimum Rust version for the whole workspace, stated where people look:
/// every member inherits both from `[workspace.package]`, the internal entries of
/// `[workspace.dependencies]` ask for that version, CHANGELOG.md has a section for it, and
/// CONTRIBUTING.md states the minimum Rust version. (Building with that Rust itself needs its
/// toolchain; Cargo refuses an older one by `rust-version`.)
#[test]
fn versions_and_msrv_are_stated_once() {
    let root = root();
    let manifest: toml::Table = read(&root.join("Cargo.toml"))
        .parse()
        .expect("Cargo.toml parses");
    let workspace = manifest["workspace"].as_table().expect("[workspace]");
    let package = workspace["package"]
        .as_table()
        .expect("[workspace.package]");
    let version = package["version"].as_str().expect("workspace version");
    let msrv = package["rust-version"]
        .as_str()
        .expect("workspace rust-version");
    let mut wrong = Vec::new();

    let members = ["crates", "examples"].iter().flat_map(|dir| {
        std::fs::read_dir(root.join(dir))
            .expect("member folder")
            .map(|e| e.expect("entry").path().join("Cargo.toml"))
            .filter(|p| p.is_file())
    });
    for member in members {
        let table: toml::Table = read(&member).parse().expect("member manifest parses");
        let package = table["package"].as_table().expect("[package]");
        for key in ["version", "rust-version"] {
            let inherited = package
                .get(key)
                .and_then(toml::Value::as_table)
                .and_then(|t| t.get("workspace"))
                .and_then(toml::Value::as_bool);
            if inherited != Some(true) {
                wrong.push(format!(
                    "{}: `{key}` is not `{key}.workspace = true`",
                    shown(&member)
                ));
            }
        }
    }
    let dependencies = workspace["dependencies"]
        .as_table()
        .expect("[workspace.dependencies]");
    for (name, spec) in dependencies {
        let Some(spec) = spec.as_table().filter(|s| s.contains_key("path")) else {
            continue;
        };
        if spec.get("version").and_then(toml::Value::as_str) != Some(version) {
            wrong.push(format!(
                "[workspace.dependencies] {name}: version is not the workspace's {version}"
            ));
        }
    }
    if !read(&root.join("CHANGELOG.md")).contains(&format!("## [{version}]")) {
        wrong.push(format!("CHANGELOG.md has no `## [{version}]` section"));
    }
    if !read(&root.join("CONTRIBUTING.md")).contains(msrv) {
        wrong.push(format!(
            "CONTRIBUTING.md does not state the minimum Rust version {msrv}"
        ));
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}
