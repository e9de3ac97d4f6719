package main

import (
	"encoding/json"
	"runtime/debug"
)

// buildInfo is what nodelanectl version prints.
type buildInfo struct {
	Version   string `json:"version"`
	GoVersion string `json:"go_version"`
	Revision  string `json:"vcs_revision"`
	Time      string `json:"vcs_time"`
	Modified  bool   `json:"vcs_modified"`
	Module    string `json:"module"`
}

// readBuildInfo reads the module version and the VCS stamp of the
// binary (runtime/debug.ReadBuildInfo): "(devel)" and no revision for a
// go run or a test binary.
func readBuildInfo() buildInfo {
	bi := buildInfo{Version: "(unknown)"}
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return bi
	}
	bi.Version, bi.GoVersion, bi.Module = info.Main.Version, info.GoVersion, info.Main.Path
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			bi.Revision = s.Value
		case "vcs.time":
			bi.Time = s.Value
		case "vcs.modified":
			bi.Modified = s.Value == "true"
		}
	}
	return bi
}

func (a *app) version(args []string) error {
	fs := a.flags("version", "")
	if err := a.parse(fs, args, 0, 0); err != nil {
		return err
	}
	bi := readBuildInfo()
	if a.raw() {
		b, err := json.Marshal(bi)
		if err != nil {
			return err
		}
		return a.printRaw(b)
	}
	t := newTable(a.stdout)
	t.row("version", bi.Version)
	t.row("module", orDash(bi.Module))
	t.row("go", orDash(bi.GoVersion))
	t.row("revision", orDash(bi.Revision))
	t.row("time", orDash(bi.Time))
	if bi.Revision != "" {
		t.row("modified", boolWord(bi.Modified))
	}
	t.flush()
	return nil
}

func boolWord(b bool) string {
	if b {
		return "true"
	}
	return "false"
}
