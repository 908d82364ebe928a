//! `#[derive(Changes)]`: what a reload changes in a config type, one line per key.
//!
//! On a struct with named fields, every field is compared (through its own
//! `Changes`), under `<key>.<field>`; a field may say
//! - `#[changes(restart = "why")]` (or just `restart`): read only at start, so a
//!   reload that changes it is refused, naming it;
//! - `#[changes(restart_if_added_or_removed = "why")]`: an optional section whose
//!   keys apply live but whose presence is read only at start;
//! - `#[changes(keyed)]`: a list whose elements are told apart by their `Keyed::id`
//!   (rules by name), reported as added, removed or changed one by one;
//! - `#[changes(redacted)]`: its values are never printed (a URL with a password);
//! - `#[changes(unset = "what")]`: an `Option` whose absence is a default, not
//!   "off" (kept apart from the default only so that `limiter check` can tell it was
//!   not set): shown as `what (default)`;
//! - `#[changes(flatten)]`: reported under the struct's own key (a plan's limit is
//!   `proxy.plans.free`, not `proxy.plans.free.spec`);
//! - `#[changes(skip = "why")]`: not compared here, because something else reports it.
//!
//! On the struct itself, `#[changes(display)]` makes it one value, shown with its
//! `Display` (`1000 pps, burst 200`). An enum is one value: a unit variant is shown
//! by its snake-case name, as the config writes it, a variant with one field by its
//! name and that field.

use proc_macro2::{Span, TokenStream};
use quote::{format_ident, quote};
use syn::{Data, DeriveInput, Fields, LitStr, parse_macro_input, spanned::Spanned};

#[proc_macro_derive(Changes, attributes(changes))]
pub fn derive_changes(input: proc_macro::TokenStream) -> proc_macro::TokenStream {
    let input = parse_macro_input!(input as DeriveInput);
    expand(&input).unwrap_or_else(syn::Error::into_compile_error).into()
}

fn expand(input: &DeriveInput) -> syn::Result<TokenStream> {
    let name = &input.ident;
    let (impl_generics, type_generics, where_clause) = input.generics.split_for_impl();
    let as_one_value = TypeAttrs::parse(input)?.display;
    let body = match &input.data {
        Data::Struct(_) if as_one_value => one_value(quote! { ::std::string::ToString::to_string(self) }),
        Data::Struct(data) => match &data.fields {
            Fields::Named(fields) => by_field(fields)?,
            Fields::Unnamed(fields) if fields.unnamed.len() == 1 => {
                one_value(quote! { ::limiter_config::changes::Changes::describe(&self.0) })
            }
            _ => return Err(syn::Error::new(name.span(), "Changes: a struct with named fields, or one field")),
        },
        Data::Enum(data) => {
            let arms = data.variants.iter().map(|variant| {
                let ident = &variant.ident;
                let shown = LitStr::new(&snake_case(&ident.to_string()), ident.span());
                match &variant.fields {
                    Fields::Unit => Ok(quote! { Self::#ident => ::std::string::String::from(#shown) }),
                    Fields::Unnamed(fields) if fields.unnamed.len() == 1 => Ok(quote! {
                        Self::#ident(inner) => ::std::format!(
                            "{} {}", #shown, ::limiter_config::changes::Changes::describe(inner)
                        )
                    }),
                    _ => Err(syn::Error::new(variant.span(), "Changes: unit variants, or variants of one field")),
                }
            });
            let arms = arms.collect::<syn::Result<Vec<_>>>()?;
            one_value(quote! { match self { #(#arms,)* } })
        }
        Data::Union(_) => return Err(syn::Error::new(name.span(), "Changes: not on a union")),
    };
    Ok(quote! {
        impl #impl_generics ::limiter_config::changes::Changes for #name #type_generics #where_clause {
            #body
        }
    })
}

/// Compared whole; `describe` is `shown`.
fn one_value(shown: TokenStream) -> TokenStream {
    quote! {
        fn changes(&self, new: &Self, key: &str, out: &mut ::std::vec::Vec<::limiter_config::changes::Change>) {
            ::limiter_config::changes::whole(self, new, key, out);
        }

        fn describe(&self) -> ::std::string::String {
            #shown
        }
    }
}

/// Each field under its own key.
fn by_field(fields: &syn::FieldsNamed) -> syn::Result<TokenStream> {
    let mut compared = Vec::new();
    let mut described = Vec::new();
    for field in &fields.named {
        let Some(ident) = &field.ident else { continue };
        let attrs = FieldAttrs::parse(field)?;
        if attrs.skip {
            continue;
        }
        let name = LitStr::new(&ident.to_string(), ident.span());
        let at = if attrs.flatten {
            quote! { key }
        } else {
            quote! { &::limiter_config::changes::child(key, #name) }
        };
        let compare = if attrs.keyed {
            quote! { ::limiter_config::changes::keyed(&self.#ident, &new.#ident, #at, out) }
        } else if let Some(unset) = &attrs.unset {
            quote! { ::limiter_config::changes::defaulted(&self.#ident, &new.#ident, #unset, #at, out) }
        } else {
            quote! { ::limiter_config::changes::Changes::changes(&self.#ident, &new.#ident, #at, out) }
        };
        let start = format_ident!("start_{}", ident, span = Span::call_site());
        let mark =
            attrs.restart.map(|why| quote! { ::limiter_config::changes::needs_restart(&mut out[#start..], #why); });
        let presence = attrs.presence.map(|why| {
            quote! { ::limiter_config::changes::presence_needs_restart(&mut out[#start..], #at, #why); }
        });
        let redact = attrs.redacted.then(|| quote! { ::limiter_config::changes::redact(&mut out[#start..]); });
        compared.push(quote! {
            let #start = out.len();
            #compare;
            #mark
            #presence
            #redact
        });
        let shown = if attrs.redacted {
            quote! { ::std::string::String::from("(redacted)") }
        } else if let Some(unset) = &attrs.unset {
            quote! { ::limiter_config::changes::describe_defaulted(&self.#ident, #unset) }
        } else {
            quote! { ::limiter_config::changes::Changes::describe(&self.#ident) }
        };
        described.push(quote! { ::std::format!("{} = {}", #name, #shown) });
    }
    Ok(quote! {
        #[allow(unused_variables)]
        fn changes(&self, new: &Self, key: &str, out: &mut ::std::vec::Vec<::limiter_config::changes::Change>) {
            #(#compared)*
        }

        fn describe(&self) -> ::std::string::String {
            let fields: ::std::vec::Vec<::std::string::String> = ::std::vec![#(#described),*];
            ::std::format!("{{{}}}", fields.join(", "))
        }
    })
}

#[derive(Default)]
struct TypeAttrs {
    display: bool,
}

impl TypeAttrs {
    fn parse(input: &DeriveInput) -> syn::Result<Self> {
        let mut attrs = Self::default();
        for attr in input.attrs.iter().filter(|a| a.path().is_ident("changes")) {
            attr.parse_nested_meta(|meta| {
                if meta.path.is_ident("display") {
                    attrs.display = true;
                    Ok(())
                } else {
                    Err(meta.error("on a type: #[changes(display)]"))
                }
            })?;
        }
        Ok(attrs)
    }
}

#[derive(Default)]
struct FieldAttrs {
    /// Why it needs a restart; `Some("")` when no reason is given.
    restart: Option<LitStr>,
    /// Why adding or removing it needs a restart.
    presence: Option<LitStr>,
    keyed: bool,
    redacted: bool,
    /// What an unset `Option` stands for.
    unset: Option<LitStr>,
    flatten: bool,
    skip: bool,
}

impl FieldAttrs {
    fn parse(field: &syn::Field) -> syn::Result<Self> {
        let mut attrs = Self::default();
        for attr in field.attrs.iter().filter(|a| a.path().is_ident("changes")) {
            attr.parse_nested_meta(|meta| {
                if meta.path.is_ident("restart") {
                    let why = if meta.input.peek(syn::Token![=]) {
                        meta.value()?.parse()?
                    } else {
                        LitStr::new("", meta.path.span())
                    };
                    attrs.restart = Some(why);
                } else if meta.path.is_ident("restart_if_added_or_removed") {
                    attrs.presence = Some(meta.value()?.parse()?);
                } else if meta.path.is_ident("keyed") {
                    attrs.keyed = true;
                } else if meta.path.is_ident("redacted") {
                    attrs.redacted = true;
                } else if meta.path.is_ident("unset") {
                    attrs.unset = Some(meta.value()?.parse()?);
                } else if meta.path.is_ident("flatten") {
                    attrs.flatten = true;
                } else if meta.path.is_ident("skip") {
                    // The reason is for the reader; it must be given.
                    let _why: LitStr = meta.value()?.parse()?;
                    attrs.skip = true;
                } else {
                    return Err(
                        meta.error("on a field: restart [= \"why\"], restart_if_added_or_removed = \"why\", keyed, redacted, unset = \"what\", flatten or skip = \"why\"")
                    );
                }
                Ok(())
            })?;
        }
        Ok(attrs)
    }
}

/// `SlidingWindowLog` → `sliding_window_log`, as serde's `rename_all = "snake_case"`.
fn snake_case(ident: &str) -> String {
    let mut out = String::new();
    for (i, c) in ident.chars().enumerate() {
        if c.is_uppercase() {
            if i > 0 {
                out.push('_');
            }
            out.extend(c.to_lowercase());
        } else {
            out.push(c);
        }
    }
    out
}
