//! [`query_set!`](crate::query_set!): a database crate's set of bundled queries, named once.
//!
//! Each SQL database crate keeps its statements in `.sql` files under its own `queries/`
//! folder and renders them once per configured table into a struct of `Arc<str>` fields. The
//! macro writes that struct from one list of field names (each file is named after its field,
//! behind a common prefix): the fields, the constructor that renders each file, and the list
//! of every rendered file for the test that checks them all.

/// Declares a struct holding a crate's bundled queries, each rendered once.
///
/// ```ignore
/// outbox_sql::query_set! {
///     /// Every query of this crate, rendered once for one outbox table.
///     pub(crate) struct Queries;
///     fn new(table: &Identifier), rendered by |sql| render(sql, table);
///     // The field `claim_batch` holds `queries/outbox_claim_batch.sql`; a field whose file
///     // is named otherwise names it in full.
///     files "outbox_" { claim_batch, insert, purge = "outbox_dead_purge_select" }
///     files "" { replay_count }
///     // Optional: fields that are not a rendered file, each with its initialiser.
///     derived {
///         /// The table, rendered.
///         table: Arc<str> = render("{{table}}", table).into(),
///     }
/// }
/// ```
///
/// This declares:
/// - the struct (`#[derive(Debug, Clone)]`, with the given doc and visibility), with one
///   `Arc<str>` field per file, documented with the file it holds, then the derived fields;
/// - `fn new(..)` with the given parameters (same visibility as the struct): it reads each
///   `queries/<file_stem>.sql` of the invoking crate (by `include_str!`, at compile time, from
///   the folder of the crate's `Cargo.toml`), passes its text to the rendering closure, and
///   turns what the closure returns (a `String` or anything else `Into<Arc<str>>`) into the
///   field. The derived fields' initialisers run last, in order, and may name the
///   constructor's parameters and every file field (as a local `Arc<str>`);
/// - `fn all(&self)`, every file field as `(file_stem, rendered text)`, in list order (the
///   derived fields are not in it): a test loops over it to check that every bundled file
///   renders without leftover placeholders. Only tests call it, so it carries
///   `#[allow(dead_code)]`.
///
/// A field's file stem is the `files` block's prefix followed by the field's name, unless the
/// field names its stem (`field = "stem"`, the whole stem, without the prefix).
#[macro_export]
macro_rules! query_set {
    (
        $(#[$meta:meta])*
        $vis:vis struct $name:ident;
        fn new($($arg:ident: $arg_ty:ty),+ $(,)?), rendered by $render:expr;
        $(files $prefix:literal {
            $($field:ident $(= $file:literal)?),+ $(,)?
        })+
        $(derived {
            $($(#[$derived_meta:meta])* $derived:ident: $derived_ty:ty = $init:expr),+ $(,)?
        })?
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone)]
        $vis struct $name {
            $($(
                #[doc = concat!("`queries/", $crate::query_stem!($prefix, $field $(= $file)?), ".sql`, rendered.")]
                $vis $field: ::std::sync::Arc<str>,
            )+)+
            $($(
                $(#[$derived_meta])*
                $vis $derived: $derived_ty,
            )+)?
        }

        impl $name {
            /// Renders every bundled query of this set.
            $vis fn new($($arg: $arg_ty),+) -> Self {
                let render_file = $render;
                $($(
                    let $field: ::std::sync::Arc<str> = ::std::convert::Into::into(render_file(
                        include_str!(concat!(
                            env!("CARGO_MANIFEST_DIR"),
                            "/queries/",
                            $crate::query_stem!($prefix, $field $(= $file)?),
                            ".sql"
                        )),
                    ));
                )+)+
                $($(
                    let $derived: $derived_ty = $init;
                )+)?
                Self {
                    $($($field,)+)+
                    $($($derived,)+)?
                }
            }

            /// Every rendered file of this set, as `(file stem, text)`, in declaration order.
            #[allow(dead_code)] // only tests read every query at once
            $vis fn all(&self) -> impl Iterator<Item = (&'static str, &str)> + '_ {
                [$($(
                    ($crate::query_stem!($prefix, $field $(= $file)?), &*self.$field),
                )+)+]
                .into_iter()
            }
        }
    };
}

/// The file stem of one [`query_set!`](crate::query_set!) field: the stem it names, or the
/// `files` block's prefix followed by its name. A string literal, usable in `concat!`.
#[doc(hidden)]
#[macro_export]
macro_rules! query_stem {
    ($prefix:literal, $field:ident = $file:literal) => {
        $file
    };
    ($prefix:literal, $field:ident) => {
        concat!($prefix, stringify!($field))
    };
}
