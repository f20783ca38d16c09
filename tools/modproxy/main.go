// Command modproxy writes a Go module proxy into a directory, to be read
// with GOPROXY=file://DIR, that serves modules from the directories they
// are in, at the versions the others require: a module required by
// another, before that version is tagged and published. .ci/run checks
// with it that each of idem's modules could be tagged as it is (see
// CONTRIBUTING.md, "Releasing").
//
// Usage:
//
//	modproxy -o DIR [-tags REPO] MODULEDIR...
//
// For each module whose go.mod is in one of the MODULEDIRs, and each
// version of it that the go.mod of another MODULEDIR requires, modproxy
// writes the files the go command asks a proxy for: the version's go.mod,
// its .info and its zip, made from the module's directory as
// golang.org/x/mod/zip makes it (without the subdirectories that are
// modules of their own). It fails on a file a module zip may not hold. It
// prints each module and version it serves, one a line.
//
// With -tags, a version already tagged in the git repository REPO is not
// served, and comes from the proxies after DIR in GOPROXY, as it does for
// a user: the first MODULEDIR is taken for the repository's root, and a
// module in its subdirectory sub/dir is tagged sub/dir/v1.2.3, as the go
// command reads tags.
//
// The zips are not those of a tag: use GONOSUMDB for the modules they
// serve, and a module cache of their own (GOMODCACHE), so that no other
// build reads them.
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"time"

	"golang.org/x/mod/modfile"
	"golang.org/x/mod/module"
	"golang.org/x/mod/semver"
	modzip "golang.org/x/mod/zip"
)

func main() {
	out := flag.String("o", "", "the proxy's `directory` (created if missing)")
	repo := flag.String("tags", "", "the git `repository` whose tagged versions are not served")
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "usage: modproxy -o DIR [-tags REPO] MODULEDIR...\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	if *out == "" || flag.NArg() == 0 {
		flag.Usage()
		os.Exit(2)
	}
	if err := run(*out, *repo, flag.Args()); err != nil {
		fmt.Fprintln(os.Stderr, "modproxy:", err)
		os.Exit(1)
	}
}

// local is a module in a directory of its own.
type local struct {
	dir   string
	rel   string // dir relative to the first module's, slash-separated
	gomod []byte
	file  *modfile.File
}

func run(out, repo string, dirs []string) error {
	mods := map[string]*local{} // by module path
	var paths []string
	for _, dir := range dirs {
		name := filepath.Join(dir, "go.mod")
		data, err := os.ReadFile(name)
		if err != nil {
			return err
		}
		f, err := modfile.ParseLax(name, data, nil)
		if err != nil {
			return err
		}
		if f.Module == nil {
			return fmt.Errorf("%s: no module directive", name)
		}
		mp := f.Module.Mod.Path
		if _, dup := mods[mp]; dup {
			return fmt.Errorf("module %s is in two directories", mp)
		}
		rel, err := filepath.Rel(dirs[0], dir)
		if err != nil {
			return err
		}
		mods[mp] = &local{dir: dir, rel: filepath.ToSlash(rel), gomod: data, file: f}
		paths = append(paths, mp)
	}

	// The versions each module is required at by the others.
	wanted := map[string][]string{}
	for _, mp := range paths {
		for _, r := range mods[mp].file.Require {
			if _, ok := mods[r.Mod.Path]; ok && r.Mod.Path != mp &&
				!slices.Contains(wanted[r.Mod.Path], r.Mod.Version) {
				wanted[r.Mod.Path] = append(wanted[r.Mod.Path], r.Mod.Version)
			}
		}
	}

	for _, mp := range paths {
		versions := wanted[mp]
		semver.Sort(versions)
		for _, v := range versions {
			if repo != "" {
				tag := path.Join(mods[mp].rel, v)
				tagged, err := hasTag(repo, tag)
				if err != nil {
					return err
				}
				if tagged {
					fmt.Fprintf(os.Stderr, "modproxy: %s %s is tagged %s: not served\n", mp, v, tag)
					continue
				}
			}
			if err := serve(out, module.Version{Path: mp, Version: v}, mods[mp]); err != nil {
				return err
			}
			fmt.Println(mp, v)
		}
	}
	return nil
}

// serve writes m's list, .info, .mod and .zip into the proxy at out, from
// the module in l.
func serve(out string, m module.Version, l *local) (err error) {
	if err := module.Check(m.Path, m.Version); err != nil {
		return err
	}
	escPath, err := module.EscapePath(m.Path)
	if err != nil {
		return err
	}
	escVersion, err := module.EscapeVersion(m.Version)
	if err != nil {
		return err
	}
	dir := filepath.Join(out, filepath.FromSlash(escPath), "@v")
	if err := os.MkdirAll(dir, 0o777); err != nil {
		return err
	}

	// CreateFromDir stops at the first file a module zip may not hold (the
	// go command makes no zip of such a tag, so the version cannot be
	// fetched): CheckDir names them all.
	if _, err := modzip.CheckDir(l.dir); err != nil {
		return fmt.Errorf("%s cannot be released: %w", m.Path, err)
	}

	zf, err := os.Create(filepath.Join(dir, escVersion+".zip"))
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, zf.Close()) }()
	if err := modzip.CreateFromDir(zf, m, l.dir); err != nil {
		return err
	}

	info, err := json.Marshal(struct {
		Version string
		Time    time.Time
	}{m.Version, time.Now().UTC().Truncate(time.Second)})
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, escVersion+".info"), info, 0o666); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, escVersion+".mod"), l.gomod, 0o666); err != nil {
		return err
	}

	list, err := os.OpenFile(filepath.Join(dir, "list"), os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o666)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, list.Close()) }()
	_, err = fmt.Fprintln(list, m.Version)
	return err
}

// hasTag reports whether the git repository repo has the tag.
func hasTag(repo, tag string) (bool, error) {
	out, err := exec.Command("git", "-C", repo, "tag", "--list", tag).Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return false, fmt.Errorf("git tag --list %s: %w: %s", tag, err, ee.Stderr)
		}
		return false, err
	}
	return len(out) > 0, nil
}
