#!/bin/bash
# count.sh [REV...]: issue 28's line count at each REV (default HEAD): the
# non-test .go files of bunstore and lease and the .sql files under
# bunstore/sql, without migrations and lease/leasetest, read from git.
cd "$(dirname "$0")/../.."
for rev in "${@:-HEAD}"; do
	git ls-tree -r --name-only "$rev" -- bunstore lease | grep -E '\.(go|sql)$' | grep -v '_test\.go$' |
		grep -v '/migrations/' | grep -v '^lease/leasetest/' |
		while read -r f; do git show "$rev:$f" | wc -l; done |
		awk -v rev="$rev" '{ s += $1 } END { print rev, s }'
done
