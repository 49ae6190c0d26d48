//! Flame graphs as `profilerd flamegraph` and `/debug/pprof/...&format=svg`
//! draw them (inferno's SVG), read back: the title, and how wide the
//! frames of a function are.

/// A parsed flame graph.
pub struct FlameGraph<'a> {
    doc: roxmltree::Document<'a>,
}

impl<'a> FlameGraph<'a> {
    /// Parses `svg`; panics with the text when it is not well-formed SVG.
    pub fn parse(svg: &'a str) -> FlameGraph<'a> {
        let options = roxmltree::ParsingOptions {
            allow_dtd: true,
            ..Default::default()
        };
        let doc = roxmltree::Document::parse_with_options(svg, options)
            .unwrap_or_else(|e| panic!("not well-formed XML: {e}\n{svg}"));
        assert_eq!(doc.root_element().tag_name().name(), "svg", "{svg}");
        FlameGraph { doc }
    }

    /// The title line.
    pub fn title(&self) -> &str {
        self.doc
            .descendants()
            .find(|n| n.attribute("id") == Some("title"))
            .and_then(|n| n.text())
            .unwrap_or_default()
    }

    /// The summed widths (percent of the graph) of the frames of
    /// `function`.
    pub fn width_of(&self, function: &str) -> f64 {
        self.doc
            .descendants()
            .filter(|g| g.has_tag_name("g"))
            .filter(|g| {
                g.children()
                    .find(|c| c.has_tag_name("title"))
                    .and_then(|t| t.text())
                    .is_some_and(|t| t.starts_with(&format!("{function} (")))
            })
            .filter_map(|g| g.children().find(|c| c.has_tag_name("rect")))
            .filter_map(|r| r.attribute("width"))
            .map(|w| {
                w.trim_end_matches('%')
                    .parse::<f64>()
                    .unwrap_or_else(|_| panic!("a frame {w:?} wide"))
            })
            .sum()
    }
}
