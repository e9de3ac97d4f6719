package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"
)

// cmdFlags are a command's flags as completion offers them.
type cmdFlags struct {
	// names are the flags, with their dash.
	names []string
	// valued are those that take a value; files those whose value is a
	// file.
	valued, files []string
}

// flagsOf reads the flags of command group verb by running it with -h
// on an app of its own, which stops at the flags.
func flagsOf(group, verb string) cmdFlags {
	a := newApp(context.Background(), io.Discard, io.Discard, func(string) string { return "" })
	var err error
	if verb == "" {
		switch group {
		case "version":
			err = a.version([]string{"-h"})
		default:
			fs := flag.NewFlagSet("nodelanectl", flag.ContinueOnError)
			a.bindCommon(fs)
			a.lastFlags = fs
		}
	} else {
		err = groups[group][verb].run(a, []string{"-h"})
	}
	if err != nil && !errors.Is(err, flag.ErrHelp) {
		panic(fmt.Sprintf("%s %s -h: %v", group, verb, err)) // a command that does not parse -h first
	}
	var f cmdFlags
	a.lastFlags.VisitAll(func(fl *flag.Flag) {
		f.names = append(f.names, "-"+fl.Name)
		if b, ok := fl.Value.(interface{ IsBoolFlag() bool }); ok && b.IsBoolFlag() {
			return
		}
		f.valued = append(f.valued, "-"+fl.Name)
		if name, _ := flag.UnquoteUsage(fl); name == "file" {
			f.files = append(f.files, "-"+fl.Name)
		}
	})
	return f
}

// flagValues are the values completion offers for some flags.
func flagValues() map[string][]string {
	return map[string][]string{
		"-o":     outputFormats,
		"-order": {orderDesc, orderAsc},
		"-state": {"queued", "leased", "running", "succeeded", "failed", "canceled"},
		"-by":    costGroupings,
		"-kind":  strings.Split(kindList(), ", "),
	}
}

// The shells completion writes scripts for.
var shells = []string{"bash", "zsh"}

func (a *app) completion(args []string) error {
	fs := a.flags("completion", "bash|zsh")
	if err := a.parse(fs, args, 1, 1); err != nil {
		return err
	}
	switch a.arg(0) {
	case "bash":
		_, err := io.WriteString(a.stdout, completionScript(false))
		return err
	case "zsh":
		_, err := io.WriteString(a.stdout, completionScript(true))
		return err
	}
	return usagef("completion: unknown shell %q: want one of %s", a.arg(0), strings.Join(shells, ", "))
}

// completionScript writes the completion function of bash, or of zsh:
// the same logic (find the group and the verb among the words, skipping
// flags and their values; offer the values of the flag before the word,
// else the verbs of the group, else the command's flags), in each
// shell's words.
func completionScript(zsh bool) string {
	var b strings.Builder
	common := flagsOf("", "")
	valued, files := slices.Clone(common.valued), slices.Clone(common.files)
	type entry struct {
		group, verb string
		f           cmdFlags
	}
	var cmds []entry
	for _, g := range sortedKeys(groups) {
		for _, v := range sortedKeys(groups[g]) {
			f := flagsOf(g, v)
			cmds = append(cmds, entry{g, v, f})
			valued = append(valued, f.valued...)
			files = append(files, f.files...)
		}
	}
	slices.Sort(valued)
	valued = slices.Compact(valued)
	slices.Sort(files)
	files = slices.Compact(files)
	top := append(sortedKeys(groups), "version", "completion", "help")

	// The words of each shell.
	offer, offerFiles := `COMPREPLY=($(compgen -W "%s" -- "$cur"))`, `COMPREPLY=($(compgen -f -- "$cur"))`
	if zsh {
		offer, offerFiles = `compadd -- %s`, `_files`
	}
	alt := func(words []string) string { return strings.Join(words, "|") }

	if zsh {
		b.WriteString("#compdef nodelanectl\n# zsh completion for nodelanectl: nodelanectl completion zsh > \"${fpath[1]}/_nodelanectl\",\n# or source <(nodelanectl completion zsh) after compinit.\n")
		b.WriteString("_nodelanectl() {\n  local group= verb= i w cur=${words[CURRENT]} prev=${words[CURRENT-1]}\n")
		b.WriteString("  for ((i = 2; i < CURRENT; i++)); do\n    w=${words[i]}\n    case $w in\n")
		fmt.Fprintf(&b, "      (%s) ((i++)); continue ;;\n      (-*) continue ;;\n    esac\n", alt(valued))
	} else {
		b.WriteString("# bash completion for nodelanectl: source <(nodelanectl completion bash)\n")
		b.WriteString("_nodelanectl() {\n  local group= verb= i w cur=\"${COMP_WORDS[COMP_CWORD]}\" prev=\"${COMP_WORDS[COMP_CWORD-1]}\"\n  COMPREPLY=()\n")
		b.WriteString("  for ((i = 1; i < COMP_CWORD; i++)); do\n    w=\"${COMP_WORDS[i]}\"\n    case \"$w\" in\n")
		fmt.Fprintf(&b, "      %s) ((i++)); continue ;;\n      -*) continue ;;\n    esac\n", alt(valued))
	}
	b.WriteString("    if [[ -z $group ]]; then group=$w; elif [[ -z $verb ]]; then verb=$w; fi\n  done\n")
	open, end := "", ")"
	if zsh {
		open = "("
	}
	b.WriteString("  case $prev in\n")
	vals := flagValues()
	for _, k := range sortedKeys(vals) {
		fmt.Fprintf(&b, "    %s%s%s "+offer+"; return ;;\n", open, k, end, strings.Join(vals[k], " "))
	}
	fmt.Fprintf(&b, "    %s%s%s %s; return ;;\n", open, alt(files), end, offerFiles)
	// Any other flag's value: nothing to offer.
	fmt.Fprintf(&b, "    %s%s%s return ;;\n", open, alt(valued), end)
	b.WriteString("  esac\n")
	b.WriteString("  case $group in\n")
	fmt.Fprintf(&b, "    %s\"\"%s "+offer+" ;;\n", open, end, strings.Join(top, " "))
	fmt.Fprintf(&b, "    %scompletion%s [[ -z $verb ]] && "+offer+" ;;\n", open, end, strings.Join(shells, " "))
	fmt.Fprintf(&b, "    %shelp%s [[ -z $verb ]] && "+offer+" ;;\n", open, end, strings.Join(sortedKeys(groups), " "))
	fmt.Fprintf(&b, "    %sversion%s "+offer+" ;;\n", open, end, strings.Join(flagsOf("version", "").names, " "))
	for _, g := range sortedKeys(groups) {
		fmt.Fprintf(&b, "    %s%s%s\n      case $verb in\n", open, g, end)
		fmt.Fprintf(&b, "        %s\"\"%s "+offer+" ;;\n", open, end, strings.Join(sortedKeys(groups[g]), " "))
		for _, c := range cmds {
			if c.group == g {
				fmt.Fprintf(&b, "        %s%s%s "+offer+" ;;\n", open, c.verb, end, strings.Join(c.f.names, " "))
			}
		}
		b.WriteString("      esac ;;\n")
	}
	b.WriteString("  esac\n}\n")
	if zsh {
		b.WriteString("if [[ $funcstack[1] == _nodelanectl ]]; then _nodelanectl \"$@\"; else compdef _nodelanectl nodelanectl; fi\n")
	} else {
		b.WriteString("complete -F _nodelanectl nodelanectl\n")
	}
	return b.String()
}
