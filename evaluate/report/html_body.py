"""report.md's Markdown as report.html's body. Each `##` section is a
<section> with an id from its heading ("What to use on this machine" ->
#what-to-use-on-this-machine), each `###` heading has one too. Every table
sorts by a clicked header and scrolls in its own box (so its header can
stick), and the columns whose value is the same on every row move into its
caption (not in the answer, whose columns are the answer; its `secondary`
ones a narrow screen may hide). An ordered
list keeps report.md's numbers. An image alone in its paragraph whose
`<name>.png` is a figure given becomes that inline figure, an italic
paragraph right under it its caption; figures sit beside the table or list
just above them (below it where the page is too narrow). Any other image
is its alt text, so the page loads no file; raw HTML in the text is escaped:
names from the results store are shown, never run."""
import html
import re
from dataclasses import dataclass, field

from markdown_it import MarkdownIt
from markdown_it.token import Token

LONG_CELL = 40  # characters of Markdown: a longer table cell wraps
ANSWER_CLASS = "answer"
SAME_ON_EVERY_ROW = "Same on every row"


@dataclass
class Section:
    """One `##` section: the id its <section> carries, and its heading."""
    id: str
    title: str


@dataclass
class Body:
    """The tokens written so far, and where the last top-level table or list began (a
    figure right after it joins it in a `beside` box)."""
    out: list[Token] = field(default_factory=list)
    sections: list[Section] = field(default_factory=list)
    block_start: int | None = None
    beside_open: bool = False

    def add_figure(self, markup: str) -> None:
        if not self.beside_open and self.block_start is not None:
            self.out.insert(self.block_start, raw('<div class="beside">\n'))
            self.beside_open = True
        self.out.append(raw(markup))

    def new_block(self) -> None:
        """A top-level block other than a figure begins: the box of figures, if any, ends."""
        if self.beside_open:
            self.out.append(raw("</div>\n"))
        self.beside_open, self.block_start = False, None


def markdown_body(text: str, taken: set[str], figures: dict[str, str] | None = None, answer_id: str | None = None,
                  secondary: tuple[str, ...] = ()) -> tuple[str, list[Section]]:
    """The Markdown as HTML and its `##` sections; `figures`: name -> inline SVG;
    `answer_id`: the section whose tables keep every column, those headed `secondary` marked so."""
    md = MarkdownIt("commonmark", {"html": False}).enable("table")
    tokens = md.parse(text)
    body = Body()
    i = 0
    while i < len(tokens):
        token = tokens[i]
        figure, used = inline_figure(tokens, i, figures or {}, md)
        if figure:
            body.add_figure(figure)
            i += used
            continue
        if token.level == 0 and token.nesting >= 0:
            body.new_block()
        if token.type == "table_open":
            end = next(k for k in range(i, len(tokens)) if tokens[k].type == "table_close")
            in_answer = bool(body.sections) and body.sections[-1].id == answer_id
            body.block_start = len(body.out)
            body.out += table_block(tokens[i:end + 1], md, in_answer, secondary if in_answer else ())
            i = end + 1
            continue
        add_token(body, tokens, i, taken)
        i += 1
    body.new_block()
    if body.sections:
        body.out.append(raw("</section>\n"))
    return md.renderer.render(body.out, md.options, {}), body.sections


def add_token(body: Body, tokens: list[Token], i: int, taken: set[str]) -> None:
    """One token as it goes on the page: headings with ids (a `##` opens its
    <section>), images as their alt text, list items with report.md's numbers."""
    token = tokens[i]
    if token.type == "inline":
        token.children = [Token("text", "", 0, content=c.content) if c.type == "image" else c
                          for c in token.children or ()]
    elif token.type == "heading_open" and token.tag in ("h2", "h3"):
        title = inline_text(tokens[i + 1])
        ident = unique_slug(title, taken)
        if token.tag == "h3":
            token.attrSet("id", ident)
        else:
            body.out.append(raw(("</section>\n" if body.sections else "") + f'<section id="{ident}">\n'))
            body.sections.append(Section(ident, title))
    elif token.type in ("ordered_list_open", "bullet_list_open") and token.level == 0:
        body.block_start = len(body.out)
    elif token.type == "list_item_open" and token.info:
        token.attrSet("value", token.info)  # the place report.md gives, not the browser's count
    body.out.append(token)


def table_block(tokens: list[Token], md: MarkdownIt, keep_columns: bool,
                secondary: tuple[str, ...] = ()) -> list[Token]:
    """A table's tokens, sortable in its scrolling box; the columns the same on
    every row left out and named in its caption (unless `keep_columns`); the
    cells of the columns headed `secondary` of class "secondary"."""
    heads, rows = table_cells(tokens)
    same = [] if keep_columns else constant_columns(heads, rows)
    minor = {c for c, head in enumerate(heads) if head.content in secondary}
    out = [raw('<div class="scroll">\n')]
    column, skip = 0, 0
    for k, token in enumerate(tokens):
        if skip:
            skip -= 1
            continue
        if token.type == "tr_open":
            column = 0
        elif token.type in ("th_open", "td_open"):
            column += 1
            if column - 1 in same:
                skip = 2    # the cell's text and its close
                continue
            if token.type == "td_open" and len(tokens[k + 1].content) > LONG_CELL:
                add_class(token, "wrap")  # prose (a failure's reason) wraps; numbers and names stay on one line
            if token.type == "td_open" and keep_columns and column - 1 in (0, len(heads) - 1):
                break_after_underscores(tokens[k + 1])   # the scenario and the runner-up; the pick stays whole
            if column - 1 in minor:
                add_class(token, "secondary")
        out.append(token)
        if token.type == "table_open":
            token.attrSet("class", "sortable" + (f" {ANSWER_CLASS}" if keep_columns else ""))
            if same:
                out.append(raw(caption(heads, rows[0], same, md)))
    return out + [raw("</div>\n")]


def break_after_underscores(inline: Token) -> None:
    """The answer's names (w8a8_sparse_smooth_gptq, high_concurrency) may break
    after an underscore (<wbr>: nothing is added to copied text), so a narrow
    screen wraps them where a reader would, not mid-word; a setting such as
    batch_size=1 stays whole (it is short, and its cell breaks at spaces)."""
    inline.children = [Token("html_inline", "", 0, content=breakable(html.escape(c.content)))
                       if c.type == "text" and "_" in c.content else c for c in inline.children or ()]


def breakable(text: str) -> str:
    return " ".join(word if "=" in word else word.replace("_", "_<wbr>") for word in text.split(" "))


def add_class(token: Token, name: str) -> None:
    token.attrSet("class", " ".join(filter(None, [str(token.attrGet("class") or ""), name])))


def table_cells(tokens: list[Token]) -> tuple[list[Token], list[list[Token]]]:
    """The inline token of each header cell, and of each body row's cells."""
    heads, rows = [], []
    for k, token in enumerate(tokens):
        if token.type == "th_open":
            heads.append(tokens[k + 1])
        elif token.type == "tr_open" and any(t.type == "tbody_open" for t in tokens[:k]):
            rows.append([])
        elif token.type == "td_open":
            rows[-1].append(tokens[k + 1])
    return heads, rows


def constant_columns(heads: list[Token], rows: list[list[Token]]) -> list[int]:
    """The columns with one value on every row, where there are two rows or more
    and two columns would be left."""
    if len(rows) < 2:
        return []
    same = [c for c in range(len(heads)) if len({row[c].content for row in rows if c < len(row)}) == 1]
    return same if len(heads) - len(same) >= 2 else []


def caption(heads: list[Token], first: list[Token], same: list[int], md: MarkdownIt) -> str:
    def shown(token: Token) -> str:
        return md.renderer.renderInline(token.children or [], md.options, {})
    parts = "; ".join(f"{shown(heads[c])}: {shown(first[c])}" for c in same)
    return f"<caption>{SAME_ON_EVERY_ROW}: {parts}</caption>\n"


def inline_figure(tokens: list[Token], i: int, figures: dict[str, str], md: MarkdownIt) -> tuple[str, int]:
    """The <figure> for a paragraph that is one image of `figures`, captioned by the
    italic paragraph under it (else by its alt text), and how many tokens it takes; ("", 0)
    for anything else."""
    if tokens[i].type != "paragraph_open" or i + 2 >= len(tokens):
        return "", 0
    children = tokens[i + 1].children or []
    if len(children) != 1 or children[0].type != "image":
        return "", 0
    name = str(children[0].attrGet("src") or "").removesuffix(".png")
    if name not in figures:
        return "", 0
    text = italic_paragraph(tokens, i + 3, md)
    markup = (f'<figure id="plot-{html.escape(name)}">\n{figures[name]}\n'
              f"<figcaption>{text or html.escape(children[0].content)}</figcaption>\n</figure>\n")
    return markup, 6 if text else 3


def italic_paragraph(tokens: list[Token], i: int, md: MarkdownIt) -> str:
    """The HTML inside a paragraph at `i` that is one emphasis throughout; "" otherwise."""
    if i + 2 >= len(tokens) or tokens[i].type != "paragraph_open":
        return ""
    children = tokens[i + 1].children or []
    if not children or children[0].type != "em_open" or children[-1].type != "em_close":
        return ""
    depth = 0
    for child in children[:-1]:
        depth += {"em_open": 1, "em_close": -1}.get(child.type, 0)
        if depth == 0:
            return ""   # the first emphasis ends before the paragraph does
    return md.renderer.renderInline(children[1:-1], md.options, {})


def raw(markup: str) -> Token:
    return Token("html_block", "", 0, content=markup)


def inline_text(inline: Token) -> str:
    """A heading's text as shown (code spans without their backticks)."""
    return "".join(child.content for child in inline.children or () if child.type in ("text", "code_inline"))


def unique_slug(text: str, taken: set[str]) -> str:
    """Lower-case words joined by hyphens; `-2`, `-3`, ... where the page already has it.
    Records the slug in `taken`."""
    base = re.sub(r"[\W_]+", "-", text.lower()).strip("-") or "section"
    slug, n = base, 1
    while slug in taken:
        n += 1
        slug = f"{base}-{n}"
    taken.add(slug)
    return slug
