//! `[ui]` in the configuration: when the console is on, what its token must be, and that the
//! token never shows.

use crate::Config;

#[test]
fn the_console_beyond_loopback_needs_a_token() {
    let base = "[metrics]\nlisten = \"0.0.0.0:9187\"\n";
    let e = Config::from_toml(&format!("{base}[ui]\nenabled = true\n"))
        .expect_err("refused")
        .to_string();
    assert!(
        e.contains("ui.enabled") && e.contains("ui.token") && e.contains("metrics.listen"),
        "{e}"
    );
    // Unset: off beyond loopback without a token, on with one or on loopback.
    let off = Config::from_toml(base).expect("valid");
    assert!(!off.ui.active(&off.metrics));
    let with_token =
        Config::from_toml(&format!("{base}[ui]\ntoken = \"0123456789abcdef\"\n")).expect("valid");
    assert!(with_token.ui.active(&with_token.metrics));
    let local = Config::from_toml("[metrics]\nlisten = \"127.0.0.1:9187\"\n").expect("valid");
    assert!(local.ui.active(&local.metrics));
    let none = Config::from_toml("").expect("valid");
    assert!(!none.ui.active(&none.metrics));

    let short = Config::from_toml(&format!("{base}[ui]\ntoken = \"short\"\n"))
        .expect_err("short")
        .to_string();
    assert!(
        short.contains("ui.token") && short.contains("16"),
        "{short}"
    );
    let no_listener = Config::from_toml("[ui]\nenabled = true\n")
        .expect_err("no listener")
        .to_string();
    assert!(no_listener.contains("metrics.listen"), "{no_listener}");
    let unknown = Config::from_toml("[ui]\nallow_action = true\n")
        .expect_err("unknown")
        .to_string();
    assert!(unknown.contains("allow_action"), "{unknown}");
}

#[test]
fn the_token_is_never_printed_and_may_come_from_a_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("ui-token");
    std::fs::write(&file, "Console-Token-From-File\n").expect("write");
    let config = Config::from_toml(&format!(
        "[metrics]\nlisten = \"0.0.0.0:9187\"\n[ui]\nenabled = true\ntoken_file = \"{}\"\n",
        file.display()
    ))
    .expect("valid");
    assert_eq!(
        config.ui.token.as_ref().map(|t| t.expose()),
        Some("Console-Token-From-File")
    );
    let printed = config.to_redacted_toml().expect("printable");
    assert!(printed.contains("token = \"***\""), "{printed}");
    assert!(!printed.contains("From-File"), "{printed}");
    assert!(!format!("{config:?}").contains("From-File"));
}
