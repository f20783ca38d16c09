// Command doccheck checks the comments of idem's Go code and the Go blocks
// of its Markdown files: every doc link names a declaration that exists,
// and every Go block of a doc comment or a Markdown file compiles. .ci/run
// runs it; it prints one line per problem and exits 1 when there is one.
//
// Run it from the repository root (the tools module is outside go.work):
//
//	(cd tools && GOWORK=off go run ./doccheck)
//
// No released tool does this: go vet does not check doc links
// (go.dev/issue/57963), gopls reports none, and go/doc shows a link to a
// name that does not exist as plain text, or as a link to nowhere when it
// names another package.
//
// # Packages
//
// Every package of every module of the repository (each go.mod that git
// tracks, except those under a testdata directory, which are fixtures): the
// workspace's modules loaded together, the others (the tools, the buf
// plugins) each on its own. Test files count; generated files
// (ast.IsGenerated) do not.
//
// # Doc links
//
// Every comment is parsed with go/doc/comment, and every doc link in it must
// resolve. A doc link is, in square brackets, as go/doc reads them:
//
//	Name  Type.Method  pkg  pkg.Name  pkg.Type.Method  *pkg.Type  import/path.Name
//
// Name must be declared in the package (test files included for a comment
// in a test file); Type.Method must name a method or a field of type Type;
// pkg must be the package itself or one of its imports, by name, or a
// standard package with a one-element path, or a full import path. A
// bracketed lower-case word that names no package (an index, say) is text
// to go/doc, and so to doccheck; pkg.Name with a pkg that names no package
// is reported. A link to a type followed by .Name (a link to Request, then
// ".Field") must name a field or method of that type too.
//
// # Go blocks
//
// An indented block of a doc comment, and a fenced go block of a Markdown
// file of the module (README.md and docs/ included: internal/readme checks
// that their blocks are in files that compile, doccheck that they compile
// as they are), is Go when it parses as a Go file, as Go declarations or, in a
// function returning error, as Go statements; other blocks (shell
// commands, protobuf, tables) are left alone. A line that is only "..." and
// a body that is only "{ ... }" stand for elided code. A file is
// type-checked as it is. Declarations and statements are type-checked in a
// scratch package that imports what they name and do not import: the
// documented package by its name (for Markdown, the package in the file's
// directory, if any), then the packages its files import (by the names
// they import them with), then any package that the loaded modules import
// under a name no other package uses. Names that the block uses without
// declaring and that name no package (ctx, pool, engine) are the block's
// surroundings: they are not reported, nor is what follows from them (an
// operand of unknown type), nor a return whose count of values is the
// surrounding function's. Unused variables and imports, values not used
// and a missing return are not reported either; every other error is.
package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"go/ast"
	"go/doc/comment"
	"go/parser"
	"go/token"
	"go/types"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/tools/go/packages"
)

var verbose = flag.Bool("v", false, "list the Go blocks checked")

func main() {
	root := flag.String("root", "..", "the repository root (the directory of go.work)")
	flag.Parse()
	if flag.NArg() > 0 {
		fail(fmt.Errorf("unexpected arguments %q", flag.Args()))
	}
	problems, err := run(*root)
	if err != nil {
		fail(err)
	}
	for _, p := range problems {
		fmt.Println(p)
	}
	if len(problems) > 0 {
		fmt.Fprintf(os.Stderr, "doccheck: %d problems in the docs: fix each doc link to name what exists, and each Go block to compile\n", len(problems))
		os.Exit(1)
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "doccheck:", err)
	os.Exit(2)
}

// run checks every module under root and returns the problems found, as
// "file:line: message" with file relative to root, sorted.
func run(root string) ([]string, error) {
	root, err := filepath.Abs(root)
	if err != nil {
		return nil, err
	}
	workspace, others, err := modules(root)
	if err != nil {
		return nil, err
	}
	markdown, err := gitFiles(root, "*.md")
	if err != nil {
		return nil, err
	}
	var problems []string
	// The workspace's modules load together, as go.work joins them; the
	// tools module runs with GOWORK=off, so the variable is reset.
	type group struct {
		dir     string
		env     []string
		modules []string // their directories
	}
	groups := []group{{root, append(os.Environ(), "GOWORK="), workspace}}
	for _, m := range others {
		groups = append(groups, group{m, append(os.Environ(), "GOWORK=off"), []string{m}})
	}
	// Each Markdown file is checked with the module it is in.
	owner := make(map[string]int)
	for _, md := range markdown {
		best := ""
		for i, g := range groups {
			for _, m := range g.modules {
				if within(md, m) && len(m) > len(best) {
					best, owner[md] = m, i
				}
			}
		}
	}
	for i, g := range groups {
		var pats []string
		for _, m := range g.modules {
			rel, err := filepath.Rel(g.dir, m)
			if err != nil {
				return nil, err
			}
			pats = append(pats, "./"+path.Join(filepath.ToSlash(rel), "..."))
		}
		c, err := load(g.dir, g.env, pats)
		if err != nil {
			return nil, err
		}
		problems = append(problems, c.check()...)
		for _, md := range markdown {
			if j, ok := owner[md]; ok && j == i {
				p, err := c.checkMarkdown(md)
				if err != nil {
					return nil, err
				}
				problems = append(problems, p...)
			}
		}
	}
	for i, p := range problems {
		if rel, err := filepath.Rel(root, p); err == nil {
			problems[i] = rel
		}
	}
	slices.Sort(problems)
	return slices.Compact(problems), nil
}

// within reports whether file is in directory dir or below it.
func within(file, dir string) bool {
	rel, err := filepath.Rel(dir, file)
	return err == nil && rel != ".." && !strings.HasPrefix(rel, ".."+string(filepath.Separator))
}

// gitFiles returns the files under root that git tracks (or would: not
// ignored) whose names match pattern, except those under a testdata
// directory.
func gitFiles(root, pattern string) ([]string, error) {
	cmd := exec.Command("git", "ls-files", "-z", "--cached", "--others", "--exclude-standard", "--", pattern, "**/"+pattern)
	cmd.Dir, cmd.Stderr = root, os.Stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("git ls-files: %v", err)
	}
	var files []string
	for _, f := range strings.Split(strings.TrimRight(string(out), "\x00"), "\x00") {
		if f == "" || slices.Contains(strings.Split(f, "/"), "testdata") {
			continue
		}
		if _, err := os.Stat(filepath.Join(root, f)); err == nil { // not deleted
			files = append(files, filepath.Join(root, filepath.FromSlash(f)))
		}
	}
	slices.Sort(files)
	return slices.Compact(files), nil
}

// modules returns the directories of the workspace's modules and those of
// the other modules git tracks.
func modules(root string) (workspace []string, others []string, err error) {
	cmd := exec.Command("go", "list", "-m", "-json")
	cmd.Dir, cmd.Env, cmd.Stderr = root, append(os.Environ(), "GOWORK="), os.Stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, nil, fmt.Errorf("go list -m: %v", err)
	}
	inWorkspace := make(map[string]bool)
	for dec := json.NewDecoder(bytes.NewReader(out)); ; {
		var m struct{ Dir string }
		if err := dec.Decode(&m); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			return nil, nil, fmt.Errorf("go list -m: %v", err)
		}
		inWorkspace[m.Dir] = true
		workspace = append(workspace, m.Dir)
	}
	mods, err := gitFiles(root, "go.mod")
	if err != nil {
		return nil, nil, err
	}
	for _, f := range mods {
		if dir := filepath.Dir(f); !inWorkspace[dir] {
			others = append(others, dir)
		}
	}
	return workspace, others, nil
}

// checker checks the packages of one load.
type checker struct {
	dir    string
	env    []string
	fset   *token.FileSet
	pkgs   []*packages.Package
	files  map[*packages.Package][]*ast.File // the parsed files of pkgs
	byPath map[string]*types.Package         // every package the loaded ones import, and themselves
	unique map[string]string                 // package name -> import path, for names imported as one package only
	blocks int                               // the Go blocks checked
}

// load loads the packages matched by patterns in dir, with their tests.
// Their types, and those of every package they import, come from export
// data, so that they are complete and share one set of objects (go/packages
// reads a dependency's export data only for what its importer uses, unless
// NeedDeps); their files are parsed here, for their comments.
func load(dir string, env, patterns []string) (*checker, error) {
	cfg := &packages.Config{
		Mode:  packages.NeedName | packages.NeedFiles | packages.NeedTypes | packages.NeedImports | packages.NeedDeps,
		Dir:   dir,
		Env:   env,
		Tests: true,
	}
	pkgs, err := packages.Load(cfg, patterns...)
	if err != nil {
		return nil, err
	}
	if packages.PrintErrors(pkgs) > 0 {
		return nil, fmt.Errorf("the packages in %s do not load", dir)
	}
	c := &checker{
		dir:    dir,
		env:    env,
		fset:   token.NewFileSet(),
		files:  make(map[*packages.Package][]*ast.File),
		byPath: make(map[string]*types.Package),
	}
	for _, p := range pkgs {
		if strings.HasSuffix(p.ID, ".test") {
			continue // the generated test main
		}
		c.pkgs = append(c.pkgs, p)
		for _, name := range p.GoFiles {
			f, err := parser.ParseFile(c.fset, name, nil, parser.ParseComments|parser.SkipObjectResolution)
			if err != nil {
				return nil, err
			}
			c.files[p] = append(c.files[p], f)
		}
	}
	// A package's own files first, then its test variants: a file is
	// checked once, in the first package that holds it, and a Go block
	// imports the packages without their test files.
	slices.SortStableFunc(c.pkgs, func(a, b *packages.Package) int {
		return strings.Compare(a.PkgPath, b.PkgPath)*2 + boolCmp(a.ID != a.PkgPath, b.ID != b.PkgPath)
	})
	packages.Visit(c.pkgs, nil, func(p *packages.Package) {
		if _, ok := c.byPath[p.PkgPath]; !ok && p.ID == p.PkgPath {
			c.byPath[p.PkgPath] = p.Types
		}
	})
	names := make(map[string]map[string]bool)
	for _, p := range c.pkgs {
		for name, path := range c.imports(p) {
			if names[name] == nil {
				names[name] = make(map[string]bool)
			}
			names[name][path] = true
		}
	}
	c.unique = make(map[string]string)
	for name, paths := range names {
		if len(paths) == 1 {
			for p := range paths {
				c.unique[name] = p
			}
		}
	}
	return c, nil
}

func boolCmp(a, b bool) int {
	switch {
	case a == b:
		return 0
	case a:
		return 1
	}
	return -1
}

// imports returns the packages the files of p import, by the name they are
// imported with; a name imported as two packages maps to "".
func (c *checker) imports(p *packages.Package) map[string]string {
	byName := make(map[string]string)
	for _, f := range c.files[p] {
		for _, s := range f.Imports {
			ipath, err := strconv.Unquote(s.Path.Value)
			if err != nil {
				continue
			}
			var name string
			switch {
			case s.Name != nil:
				name = s.Name.Name
			case c.byPath[ipath] != nil:
				name = c.byPath[ipath].Name()
			default:
				name = path.Base(ipath)
			}
			if name == "_" || name == "." {
				continue
			}
			if prev, ok := byName[name]; ok && prev != ipath {
				byName[name] = ""
			} else {
				byName[name] = ipath
			}
		}
	}
	return byName
}

// check returns the problems in the comments of the loaded packages.
func (c *checker) check() []string {
	var problems []string
	seen := make(map[string]bool)
	for _, p := range c.pkgs {
		imports := c.imports(p)
		for _, f := range c.files[p] {
			name := c.fset.File(f.Pos()).Name()
			if seen[name] || ast.IsGenerated(f) {
				continue
			}
			seen[name] = true
			for _, cg := range f.Comments {
				problems = append(problems, c.checkComment(p, imports, cg)...)
			}
		}
	}
	return problems
}

// unknown marks the import path of a doc link whose package name resolves
// to nothing.
const unknown = "\x00unknown:"

func (c *checker) checkComment(p *packages.Package, imports map[string]string, cg *ast.CommentGroup) []string {
	parser := comment.Parser{
		LookupPackage: func(name string) (string, bool) {
			if name == p.Types.Name() {
				return p.Types.Path(), true
			}
			if ipath := imports[name]; ipath != "" {
				return ipath, true
			}
			if ipath, ok := comment.DefaultLookupPackage(name); ok {
				return ipath, true
			}
			return unknown + name, true
		},
		// Every bracketed Name and Recv.Name is a link; resolve says
		// whether it names something.
		LookupSym: func(recv, name string) bool { return true },
	}
	text := cg.Text()
	doc := parser.Parse(text)
	lines := commentLines(c.fset, cg)
	var problems []string
	var visit func([]comment.Block)
	visit = func(blocks []comment.Block) {
		for _, b := range blocks {
			switch b := b.(type) {
			case *comment.Paragraph:
				problems = append(problems, c.checkLinks(p, lines, b.Text)...)
			case *comment.Heading:
				problems = append(problems, c.checkLinks(p, lines, b.Text)...)
			case *comment.List:
				for _, item := range b.Items {
					visit(item.Content)
				}
			case *comment.Code:
				problems = append(problems, c.checkCode(p, imports, lines, b.Text)...)
			}
		}
	}
	visit(doc.Content)
	return problems
}

// line is one line of a comment's text and its position.
type line struct {
	text string
	pos  token.Position
}

// commentLines returns the lines of cg without their comment markers.
func commentLines(fset *token.FileSet, cg *ast.CommentGroup) []line {
	var lines []line
	for _, c := range cg.List {
		pos := fset.Position(c.Pos())
		text := c.Text
		if strings.HasPrefix(text, "//") {
			lines = append(lines, line{text[2:], pos})
			continue
		}
		for i, l := range strings.Split(strings.TrimSuffix(strings.TrimPrefix(text, "/*"), "*/"), "\n") {
			p := pos
			p.Line += i
			lines = append(lines, line{l, p})
		}
	}
	return lines
}

// find returns the position of the first line of lines, from index from,
// that contains s, and the line's index; the first line's when none does.
func find(lines []line, s string, from int) (token.Position, int) {
	for i := from; i < len(lines); i++ {
		if strings.Contains(lines[i].text, s) {
			return lines[i].pos, i
		}
	}
	return lines[0].pos, 0
}

func (c *checker) checkLinks(p *packages.Package, lines []line, text []comment.Text) []string {
	var problems []string
	var visit func([]comment.Text)
	visit = func(text []comment.Text) {
		for i, t := range text {
			switch t := t.(type) {
			case *comment.Link:
				visit(t.Text)
			case *comment.DocLink:
				written := "[" + plain(t.Text) + "]"
				msg := c.resolve(p, t)
				if msg == "" && i+1 < len(text) {
					// A link to a type, then .Name.
					if next, ok := text[i+1].(comment.Plain); ok {
						if m := selector.FindStringSubmatch(string(next)); m != nil {
							written += m[0]
							msg = c.resolve(p, &comment.DocLink{ImportPath: t.ImportPath, Recv: t.Name, Name: m[1]})
						}
					}
				}
				if msg != "" {
					pos, _ := find(lines, written, 0)
					problems = append(problems, fmt.Sprintf("%s:%d: doc link %s: %s", pos.Filename, pos.Line, written, msg))
				}
			}
		}
	}
	visit(text)
	return problems
}

// selector is the ".Name" that may follow a doc link to a type.
var selector = regexp.MustCompile(`^\.(\p{Lu}[\pL\pN_]*)`)

func plain(text []comment.Text) string {
	var b strings.Builder
	for _, t := range text {
		switch t := t.(type) {
		case comment.Plain:
			b.WriteString(string(t))
		case comment.Italic:
			b.WriteString(string(t))
		case *comment.Link:
			b.WriteString(plain(t.Text))
		case *comment.DocLink:
			b.WriteString(plain(t.Text))
		}
	}
	return b.String()
}

// resolve returns what is wrong with the doc link l in a comment of p, or ""
// when it names a declaration that exists.
func (c *checker) resolve(p *packages.Package, l *comment.DocLink) string {
	if name, ok := strings.CutPrefix(l.ImportPath, unknown); ok {
		if l.Name == "" {
			return "" // [word]: text, not a link
		}
		return fmt.Sprintf("no package named %s is imported by %s", name, p.PkgPath)
	}
	target := p.Types
	if l.ImportPath != "" && l.ImportPath != p.Types.Path() {
		target = c.pkg(l.ImportPath)
		if target == nil {
			return fmt.Sprintf("package %s does not exist", l.ImportPath)
		}
	}
	if l.Name == "" {
		return ""
	}
	if l.Recv == "" {
		if target.Scope().Lookup(l.Name) == nil {
			return fmt.Sprintf("package %s declares no %s", target.Path(), l.Name)
		}
		return ""
	}
	tn, ok := target.Scope().Lookup(l.Recv).(*types.TypeName)
	if !ok {
		return fmt.Sprintf("package %s declares no type %s", target.Path(), l.Recv)
	}
	if obj, _, _ := types.LookupFieldOrMethod(tn.Type(), true, target, l.Name); obj == nil {
		return fmt.Sprintf("type %s.%s has no method or field %s", target.Name(), l.Recv, l.Name)
	}
	return ""
}

// pkg returns the package with the given import path, loading it if no
// loaded package imports it; nil if it does not exist.
func (c *checker) pkg(ipath string) *types.Package {
	if p, ok := c.byPath[ipath]; ok {
		return p
	}
	cfg := &packages.Config{Mode: packages.NeedName | packages.NeedTypes | packages.NeedImports | packages.NeedDeps, Dir: c.dir, Env: c.env}
	pkgs, err := packages.Load(cfg, ipath)
	var p *types.Package
	if err == nil && len(pkgs) == 1 && len(pkgs[0].Errors) == 0 {
		p = pkgs[0].Types
	}
	c.byPath[ipath] = p
	return p
}

var (
	// elidedLine is a line that only says that code is left out.
	elidedLine = regexp.MustCompile(`(?m)^(\s*)\.\.\.\s*$`)
	// elidedBody is a block whose body is left out.
	elidedBody = regexp.MustCompile(`\{\s*\.\.\.\s*\}`)
)

// fence opens a Go block of Markdown, indented or not.
var fence = regexp.MustCompile("^( *)```go\\s*$")

// checkMarkdown type-checks the Go blocks of the Markdown file name, as
// those of a doc comment of the package in its directory, if there is one.
func (c *checker) checkMarkdown(name string) ([]string, error) {
	b, err := os.ReadFile(name)
	if err != nil {
		return nil, err
	}
	var p *packages.Package
	for _, q := range c.pkgs {
		if q.ID == q.PkgPath && len(q.GoFiles) > 0 && filepath.Dir(q.GoFiles[0]) == filepath.Dir(name) {
			p = q
		}
	}
	var imports map[string]string
	if p != nil {
		imports = c.imports(p)
	}
	var (
		problems []string
		block    []line
		indent   string
		in       bool
	)
	for i, l := range strings.Split(string(b), "\n") {
		pos := token.Position{Filename: name, Line: i + 1}
		switch {
		case !in && fence.MatchString(l):
			in, indent, block = true, fence.FindStringSubmatch(l)[1], nil
		case in && strings.TrimSpace(l) == "```":
			in = false
			if len(block) == 0 {
				continue
			}
			var text strings.Builder
			for _, l := range block {
				text.WriteString(l.text)
				text.WriteByte('\n')
			}
			problems = append(problems, c.checkCode(p, imports, block, text.String())...)
		case in:
			block = append(block, line{strings.TrimPrefix(l, indent), pos})
		}
	}
	return problems, nil
}

// checkCode type-checks the code block text of a comment of p (nil for a
// Markdown file outside any package) if it is Go; lines are the comment's.
func (c *checker) checkCode(p *packages.Package, imports map[string]string, lines []line, text string) []string {
	// The block's first line in the comment.
	_, start := find(lines, strings.TrimSpace(strings.SplitN(text, "\n", 2)[0]), 0)
	text = elidedLine.ReplaceAllString(text, "$1// ...")
	text = elidedBody.ReplaceAllString(text, "{ /* ... */ }")
	fset := token.NewFileSet()
	// A whole file, with its package clause and imports, is checked as it
	// is; declarations and statements get a package clause and imports on
	// one line before them, so that the block's first line is line 3 in
	// both forms.
	first := 1
	src := text
	f, err := parser.ParseFile(fset, "scratch.go", src, parser.SkipObjectResolution)
	if err != nil {
		first = 3
		src = "package scratch\n\n" + text + "\n"
		if f, err = parser.ParseFile(fset, "scratch.go", src, parser.SkipObjectResolution); err != nil {
			src = "package scratch\n\nfunc _() error { " + text + "\nreturn nil\n}\n"
			if f, err = parser.ParseFile(fset, "scratch.go", src, parser.SkipObjectResolution); err != nil {
				return nil // not Go
			}
		}
		// Import the packages the block names and does not import itself.
		imported := make(map[string]bool)
		for _, s := range f.Imports {
			if s.Name != nil {
				imported[s.Name.Name] = true
			} else if ipath, err := strconv.Unquote(s.Path.Value); err == nil {
				imported[path.Base(ipath)] = true
			}
		}
		var specs []string
		ast.Inspect(f, func(n ast.Node) bool {
			sel, ok := n.(*ast.SelectorExpr)
			if !ok {
				return true
			}
			id, ok := sel.X.(*ast.Ident)
			if !ok || imported[id.Name] {
				return true
			}
			imported[id.Name] = true
			if ipath := c.lookupName(p, imports, id.Name); ipath != "" && c.byPath[ipath] != nil {
				specs = append(specs, fmt.Sprintf("%s %q", id.Name, ipath))
			}
			return true
		})
		src = strings.Replace(src, "package scratch\n", "package scratch; import ("+strings.Join(specs, "; ")+")\n", 1)
		if f, err = parser.ParseFile(fset, "scratch.go", src, parser.SkipObjectResolution); err != nil {
			return []string{fmt.Sprintf("%s: doccheck: %v", lines[0].pos, err)}
		}
	}
	var errs []types.Error
	conf := types.Config{
		Importer: importerFunc(func(ipath string) (*types.Package, error) {
			if q := c.byPath[ipath]; q != nil {
				return q, nil
			}
			return nil, fmt.Errorf("package %s is not loaded", ipath)
		}),
		Error: func(err error) { errs = append(errs, err.(types.Error)) },
	}
	conf.Check("scratch", fset, []*ast.File{f}, nil)
	c.blocks++
	if *verbose {
		fmt.Fprintf(os.Stderr, "%s: Go block checked\n", lines[start].pos)
	}
	var problems []string
	for _, e := range errs {
		if ignored(e) {
			continue
		}
		pos := fset.Position(e.Pos)
		at := lines[0].pos
		if i := start + pos.Line - first; pos.Line >= first && i < len(lines) {
			at = lines[i].pos
		}
		msg := strings.Join(strings.Fields(e.Msg), " ")
		problems = append(problems, fmt.Sprintf("%s:%d: Go block does not compile: %s", at.Filename, at.Line, msg))
	}
	return problems
}

// lookupName returns the import path of the package that a Go block of a
// comment of p means by name, or "" if it names none.
func (c *checker) lookupName(p *packages.Package, imports map[string]string, name string) string {
	if p != nil && p.Types.Name() == name && p.Types.Name() != "main" {
		return p.PkgPath
	}
	if ipath, ok := imports[name]; ok {
		return ipath
	}
	return c.unique[name]
}

// undefined is go/types' message for a name that is declared nowhere.
var undefined = regexp.MustCompile(`^undefined: [\pL_][\pL\pN_]*$`)

// ignored reports whether e is an error a Go block of a doc comment may
// have: a name of its surroundings, an unused variable, import or value, a
// missing return or one with another count of values than error alone.
func ignored(e types.Error) bool {
	return e.Soft || undefined.MatchString(e.Msg) || e.Msg == "missing return" || strings.HasSuffix(e.Msg, " is not used") ||
		// A return of the function around the block.
		strings.HasPrefix(e.Msg, "too many return values") || strings.HasPrefix(e.Msg, "not enough return values") ||
		// What follows from a name of the surroundings, which go/types
		// does not always leave out.
		strings.Contains(e.Msg, "unknown type") || strings.Contains(e.Msg, "invalid type")
}

type importerFunc func(path string) (*types.Package, error)

func (f importerFunc) Import(path string) (*types.Package, error) { return f(path) }
