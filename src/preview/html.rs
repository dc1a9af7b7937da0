//! What a web page says about itself: its Open Graph tags, with fallbacks
//! for pages without them (the `<title>`, a description, an image), read
//! with a WHATWG tokenizer (html5gum) after the page is decoded to text by
//! the charset it declares (encoding_rs).

use encoding_rs::Encoding;
use html5gum::{DefaultEmitter, Token, Tokenizer};
use serde_json::{Map, Value};

/// Open Graph tags kept from one page at most (the rest are ignored).
const MAX_TAGS: usize = 50;
/// Characters kept of one tag's value.
const MAX_VALUE_CHARS: usize = 1000;
/// Bytes looked at for a `<meta charset>` when neither a byte-order mark nor
/// the Content-Type says (the HTML standard's prescan looks as far).
const CHARSET_PRESCAN_BYTES: usize = 1024;
/// A description made from the page's text: at least this long when the
/// text allows, cut at a word boundary before the maximum.
const DESCRIPTION_MIN_CHARS: usize = 200;
const DESCRIPTION_MAX_CHARS: usize = 500;

/// The page's text: decoded by its byte-order mark, else the charset of its
/// Content-Type, else a `<meta charset>` (or `http-equiv` Content-Type) near
/// the start, else UTF-8. Undecodable bytes become U+FFFD.
pub fn decode(body: &[u8], header_charset: Option<&str>) -> String {
    let declared = || {
        header_charset
            .and_then(|label| Encoding::for_label(label.trim().as_bytes()))
            .or_else(|| prescan_charset(&body[..body.len().min(CHARSET_PRESCAN_BYTES)]))
    };
    let encoding = Encoding::for_bom(body).map(|(e, _)| e).or_else(declared).unwrap_or(encoding_rs::UTF_8);
    // `decode` also honours a BOM (and strips it).
    let (text, _, _) = encoding.decode(body);
    text.into_owned()
}

/// The charset a `<meta>` tag at the start of the page declares.
fn prescan_charset(head: &[u8]) -> Option<&'static Encoding> {
    let mut tokenizer = Tokenizer::new(head);
    tokenizer.find_map(|token| {
        let Ok(Token::StartTag(tag)) = token else { return None };
        if tag.name.as_slice() != b"meta" {
            return None;
        }
        let attr = |name: &[u8]| tag.attributes.get(name).map(|v| v.value.as_slice());
        if let Some(charset) = attr(b"charset") {
            return Encoding::for_label(trim_ascii(charset));
        }
        let is_content_type = attr(b"http-equiv").is_some_and(|v| v.eq_ignore_ascii_case(b"content-type"));
        let content = attr(b"content").filter(|_| is_content_type)?;
        charset_param(&String::from_utf8_lossy(content)).and_then(|c| Encoding::for_label(c.as_bytes()))
    })
}

fn trim_ascii(bytes: &[u8]) -> &[u8] {
    bytes.trim_ascii()
}

/// The `charset` parameter of a Content-Type value.
pub fn charset_param(content_type: &str) -> Option<String> {
    content_type.split(';').skip(1).find_map(|param| {
        let (name, value) = param.split_once('=')?;
        name.trim()
            .eq_ignore_ascii_case("charset")
            .then(|| value.trim().trim_matches(|c| c == '"' || c == '\'').to_owned())
    })
}

/// Where in the page the tokenizer is, for collecting text.
#[derive(Default)]
struct Reading {
    /// Inside `<title>` (the first one).
    title: Option<String>,
    title_done: bool,
    /// The first `<h1>`..`<h3>` heading's text, being read or read.
    heading: Option<String>,
    heading_open: Option<Vec<u8>>,
    /// Depth inside elements whose text is not prose (script, style, ...).
    hidden: usize,
    /// Inside `<head>` (ended by `</head>` or `<body>`).
    in_head: bool,
    body_text: String,
}

/// Elements whose text is not part of what the page says.
const HIDDEN: &[&[u8]] =
    &[b"script", b"style", b"noscript", b"template", b"svg", b"iframe", b"header", b"footer", b"nav"];

/// Reads the Open Graph tags of `html` (the page at `base`), with fallbacks:
/// `og:title` from `twitter:title`, the `<title>` or the first heading;
/// `og:description` from `twitter:description`, `<meta name=description>`
/// or the page's text; `og:image` from `twitter:image`, an `itemprop=image`,
/// the first sizeable `<img>` or the icon. Image URLs are made absolute
/// against `base`. Values are cut to [`MAX_VALUE_CHARS`].
pub fn open_graph(html: &str, base: &reqwest::Url) -> Map<String, Value> {
    let mut og: Map<String, Value> = Map::new();
    let mut twitter: Map<String, Value> = Map::new();
    let mut meta_description = None;
    let mut itemprop_image = None;
    // The first image, and the largest declaring a size over 10x10 (by area).
    let mut first_image: Option<String> = None;
    let mut largest_image: Option<(String, u64)> = None;
    let mut icon = None;
    let mut reading = Reading::default();
    let mut emitter = DefaultEmitter::default();
    // Text inside script, style, title and textarea is not markup.
    emitter.naively_switch_states(true);
    for token in Tokenizer::new_with_emitter(html, emitter) {
        let Ok(token) = token;
        match token {
            Token::StartTag(tag) => {
                let name = tag.name.as_slice();
                let attr = |key: &[u8]| {
                    tag.attributes.get(key).map(|v| String::from_utf8_lossy(&v.value).trim().to_owned())
                };
                match name {
                    b"meta" => {
                        let Some(content) = attr(b"content") else { continue };
                        let key = attr(b"property").or_else(|| attr(b"name")).unwrap_or_default();
                        let lower = key.to_ascii_lowercase();
                        if ["og:", "article:", "profile:"].iter().any(|p| lower.starts_with(p)) {
                            if og.len() < MAX_TAGS && !og.contains_key(&key) {
                                og.insert(key, Value::String(cut(&content)));
                            }
                        } else if lower.starts_with("twitter:") {
                            twitter.entry(lower).or_insert_with(|| Value::String(cut(&content)));
                        } else if lower == "description" {
                            meta_description.get_or_insert(content);
                        } else if attr(b"itemprop").is_some_and(|p| p.eq_ignore_ascii_case("image")) {
                            itemprop_image.get_or_insert(content);
                        }
                    }
                    b"title" if !reading.title_done && reading.title.is_none() => {
                        reading.title = Some(String::new());
                    }
                    b"h1" | b"h2" | b"h3" if reading.heading.is_none() => {
                        reading.heading = Some(String::new());
                        reading.heading_open = Some(name.to_vec());
                    }
                    b"img" => {
                        let Some(src) = attr(b"src") else { continue };
                        let px = |k: &[u8]| attr(k).and_then(|v| v.parse::<u64>().ok()).filter(|&n| n > 10);
                        if let (Some(w), Some(h)) = (px(b"width"), px(b"height"))
                            && largest_image.as_ref().is_none_or(|(_, area)| w.saturating_mul(h) > *area)
                        {
                            largest_image = Some((src.clone(), w.saturating_mul(h)));
                        }
                        first_image.get_or_insert(src);
                    }
                    b"link" => {
                        let rel = attr(b"rel").unwrap_or_default().to_ascii_lowercase();
                        if rel.split_ascii_whitespace().any(|r| r == "icon")
                            && let Some(href) = attr(b"href")
                        {
                            icon.get_or_insert(href);
                        }
                    }
                    b"head" => reading.in_head = true,
                    b"body" => reading.in_head = false,
                    _ => {}
                }
                if HIDDEN.contains(&name) && !tag.self_closing {
                    reading.hidden += 1;
                }
            }
            Token::EndTag(tag) => {
                let name = tag.name.as_slice();
                if name == b"head" {
                    reading.in_head = false;
                }
                if name == b"title" && reading.title.is_some() {
                    reading.title_done = true;
                }
                if reading.heading_open.as_deref() == Some(name) {
                    reading.heading_open = None;
                }
                if HIDDEN.contains(&name) {
                    reading.hidden = reading.hidden.saturating_sub(1);
                }
            }
            Token::String(text) => {
                let text = String::from_utf8_lossy(&text.value);
                if let Some(title) = reading.title.as_mut().filter(|_| !reading.title_done) {
                    push_capped(title, &text, MAX_VALUE_CHARS * 4);
                    continue;
                }
                if reading.heading_open.is_some()
                    && let Some(heading) = reading.heading.as_mut()
                {
                    push_capped(heading, &text, MAX_VALUE_CHARS * 4);
                }
                if !reading.in_head && reading.hidden == 0 {
                    push_capped(&mut reading.body_text, &text, DESCRIPTION_MAX_CHARS * 8);
                    reading.body_text.push(' ');
                }
            }
            _ => {}
        }
    }

    let fallback = |og: &mut Map<String, Value>, key: &str, value: Option<String>| {
        if !og.contains_key(key)
            && let Some(v) = value.map(|v| collapse_whitespace(&v)).filter(|v| !v.is_empty())
        {
            og.insert(key.to_owned(), Value::String(cut(&v)));
        }
    };
    // Twitter's tags stand in for missing Open Graph ones: `twitter:site` for
    // `og:site_name`, `twitter:X` for `og:X` (not the card kind or author).
    for (key, value) in twitter {
        let name = &key["twitter:".len()..];
        let og_key = match name {
            "card" | "creator" => continue,
            "site" => "og:site_name".to_owned(),
            "image:src" => "og:image".to_owned(),
            _ => format!("og:{name}"),
        };
        if og.len() < MAX_TAGS || og.contains_key(&og_key) {
            og.entry(og_key).or_insert(value);
        }
    }
    fallback(&mut og, "og:title", reading.title.filter(|_| reading.title_done).or(reading.heading));
    fallback(&mut og, "og:description", meta_description);
    fallback(&mut og, "og:description", summarize(&reading.body_text));
    fallback(&mut og, "og:image", itemprop_image);
    fallback(&mut og, "og:image", largest_image.map(|(src, _)| src).or(first_image));
    fallback(&mut og, "og:image", icon);
    for key in ["og:image", "og:image:url", "og:image:secure_url"] {
        let absolute = og.get(key).and_then(Value::as_str).and_then(|v| absolute_http_url(base, v));
        match absolute {
            Some(url) => {
                og.insert(key.to_owned(), Value::String(url));
            }
            None => {
                og.remove(key);
            }
        }
    }
    og
}

/// `href` made absolute against `base`, if that is an http(s) URL.
pub fn absolute_http_url(base: &reqwest::Url, href: &str) -> Option<String> {
    let url = base.join(href.trim()).ok()?;
    matches!(url.scheme(), "http" | "https").then(|| url.to_string())
}

fn push_capped(into: &mut String, text: &str, max_bytes: usize) {
    if into.len() >= max_bytes {
        return;
    }
    let room = max_bytes - into.len();
    let mut end = text.len().min(room);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    into.push_str(&text[..end]);
}

/// Runs of whitespace as one space, trimmed.
fn collapse_whitespace(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// At most [`MAX_VALUE_CHARS`] characters.
fn cut(text: &str) -> String {
    match text.char_indices().nth(MAX_VALUE_CHARS) {
        Some((end, _)) => text[..end].to_owned(),
        None => text.to_owned(),
    }
}

/// The page's text as a description: whole words up to
/// [`DESCRIPTION_MAX_CHARS`], with an ellipsis when cut.
fn summarize(text: &str) -> Option<String> {
    let text = collapse_whitespace(text);
    if text.is_empty() {
        return None;
    }
    if text.chars().count() <= DESCRIPTION_MAX_CHARS {
        return Some(text);
    }
    let mut out = String::new();
    for word in text.split(' ') {
        let len = out.chars().count();
        if len + 1 + word.chars().count() > DESCRIPTION_MAX_CHARS - 1 {
            if len < DESCRIPTION_MIN_CHARS {
                // One very long word: cut inside it.
                let room = DESCRIPTION_MAX_CHARS - 1 - len - usize::from(!out.is_empty());
                if !out.is_empty() {
                    out.push(' ');
                }
                out.extend(word.chars().take(room));
            }
            break;
        }
        if !out.is_empty() {
            out.push(' ');
        }
        out.push_str(word);
    }
    out.push('…');
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn base() -> reqwest::Url {
        reqwest::Url::parse("https://example.org/films/rock.html").unwrap()
    }

    fn og(html: &str) -> Map<String, Value> {
        open_graph(html, &base())
    }

    #[test]
    fn open_graph_tags_are_read_and_images_made_absolute() {
        let page = r#"<html prefix="og: http://ogp.me/ns#"><head><title>The Rock (1996)</title>
            <meta property="og:title" content="The Rock" />
            <meta property="og:type" content="video.movie" />
            <meta property="og:url" content="http://www.imdb.com/title/tt0117500/" />
            <meta property="og:image" content="test.png" />
            <meta property="og:title" content="Second title, ignored" />
            </head><body><p>Text</p></body></html>"#;
        let og = og(page);
        assert_eq!(og["og:title"], "The Rock");
        assert_eq!(og["og:type"], "video.movie");
        assert_eq!(og["og:url"], "http://www.imdb.com/title/tt0117500/");
        assert_eq!(og["og:image"], "https://example.org/films/test.png");
        assert_eq!(og["og:description"], "Text", "the page's text stands in for a description");
    }

    #[test]
    fn fallbacks_without_open_graph() {
        let page = "<html><head><title> A\n  page </title><meta name=\"description\" content=\"About it\">\
            <link rel=\"shortcut icon\" href=\"/favicon.ico\"></head>\
            <body><img src=\"dot.gif\"><img src=\"/wide.png\" width=\"300\" height=\"20\">\
            <img src=\"/big.png\" width=\"200\" height=\"100\"></body></html>";
        let og = og(page);
        assert_eq!(og["og:title"], "A page");
        assert_eq!(og["og:description"], "About it");
        assert_eq!(og["og:image"], "https://example.org/big.png", "the largest image by area");
        let og = super::open_graph("<img src=a.png><img src=b.png width=5 height=500>", &base());
        assert_eq!(og["og:image"], "https://example.org/films/a.png", "none sizeable: the first");
        let og = super::open_graph("<link rel=icon href=//cdn.example.net/i.png>", &base());
        assert_eq!(og["og:image"], "https://cdn.example.net/i.png");
        let og = super::open_graph("<body><h2>Heading</h2><h1>Later</h1>", &base());
        assert_eq!(og["og:title"], "Heading");
        let og = super::open_graph(
            "<meta name=twitter:title content=Tw><meta name=twitter:image content=/t.jpg>\
             <meta name=twitter:site content=@site><meta name=twitter:card content=summary>\
             <meta property=og:title content=OG><meta property=article:author content=Ann>",
            &base(),
        );
        assert_eq!(og["og:title"], "OG", "Open Graph wins over Twitter");
        assert_eq!(og["og:image"], "https://example.org/t.jpg");
        assert_eq!(og["og:site_name"], "@site");
        assert_eq!(og["article:author"], "Ann");
        assert!(!og.contains_key("og:card"), "{og:?}");
    }

    #[test]
    fn script_and_style_are_not_text_or_markup() {
        let page = "<html><head><script>if (a<b) { x = '<meta property=\"og:title\" content=\"evil\">' }</script>\
            <style>p { content: '<title>' }</style></head><body><script>var s = '<h1>no</h1>';</script>\
            <noscript>enable js</noscript><h1>Yes</h1><p>Real &amp; text</p></body></html>";
        let og = og(page);
        assert_eq!(og["og:title"], "Yes");
        assert_eq!(og["og:description"], "Yes Real & text");
    }

    #[test]
    fn hostile_values_are_bounded_and_only_http_images_kept() {
        let long = "x".repeat(5000);
        let mut page = format!("<meta property=og:title content=\"{long}\">");
        for i in 0..200 {
            page.push_str(&format!("<meta property=og:k{i} content=v>"));
        }
        let og = og(&page);
        assert_eq!(og["og:title"].as_str().unwrap().chars().count(), MAX_VALUE_CHARS);
        assert_eq!(og.len(), MAX_TAGS);
        let og = super::open_graph("<meta property=og:image content=\"javascript:alert(1)\">", &base());
        assert!(!og.contains_key("og:image"), "{og:?}");
        let og =
            super::open_graph("<meta property=og:image content=\"data:image/png;base64,AAAA\">", &base());
        assert!(!og.contains_key("og:image"));
    }

    #[test]
    fn long_text_is_summarized_at_a_word() {
        let words = "word ".repeat(300);
        let og = og(&format!("<body><p>{words}</p>"));
        let d = og["og:description"].as_str().unwrap();
        assert!(d.ends_with("word…"), "{d}");
        assert!(d.chars().count() <= DESCRIPTION_MAX_CHARS && d.chars().count() > DESCRIPTION_MIN_CHARS);
    }

    #[test]
    fn charsets_are_detected() {
        // "café" in windows-1252 / ISO-8859-1.
        let latin1 = b"<html><head><meta charset=\"iso-8859-1\"><title>caf\xe9</title>";
        assert!(decode(latin1, None).contains("café"));
        let equiv =
            b"<meta http-equiv=\"Content-Type\" content=\"text/html; charset=windows-1252\"><title>caf\xe9";
        assert!(decode(equiv, None).contains("café"));
        // The header wins over the meta tag; a BOM wins over both.
        assert!(decode("<meta charset=iso-8859-1>café".as_bytes(), Some("utf-8")).contains("café"));
        let mut bom = vec![0xEF, 0xBB, 0xBF];
        bom.extend_from_slice("<meta charset=iso-8859-1>café".as_bytes());
        assert!(decode(&bom, Some("iso-8859-1")).contains("café"));
        assert!(decode(b"caf\xe9", None).contains("caf\u{fffd}"), "UTF-8 by default, lossily");
        assert_eq!(charset_param("text/html; Charset=\"Shift_JIS\""), Some("Shift_JIS".into()));
        assert_eq!(charset_param("text/html"), None);
    }
}
