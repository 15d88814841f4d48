package cmdline

import (
	"fmt"
	"os"
	"strings"

	"github.com/urfave/cli/v2"
)

// BashCompletion is hpcrun completion bash: every word completes through
// hpcrun --generate-bash-completion.
const BashCompletion = `# bash completion for hpcrun; source it or put it in /etc/bash_completion.d
_hpcrun_complete() {
	local cur opts n
	cur="${COMP_WORDS[COMP_CWORD]}"
	# A flag being typed goes along: hpcrun completes the command's flags.
	n=$((COMP_CWORD-1))
	[[ "$cur" == -* ]] && n=$COMP_CWORD
	opts=$("${COMP_WORDS[0]}" "${COMP_WORDS[@]:1:$n}" --generate-bash-completion 2>/dev/null)
	COMPREPLY=($(compgen -W "${opts}" -- "${cur}"))
	return 0
}
complete -o default -F _hpcrun_complete hpcrun
`

// ZshCompletion is hpcrun completion zsh, the same for zsh.
const ZshCompletion = `#compdef hpcrun
_hpcrun() {
	local -a opts
	local n=$((CURRENT-2))
	[[ "${words[CURRENT]}" == -* ]] && n=$((CURRENT-1))
	opts=("${(@f)$(${words[1]} ${words[@]:1:$n} --generate-bash-completion 2>/dev/null)}")
	_describe 'values' opts
}
compdef _hpcrun hpcrun
`

// CompleteRuns makes the commands that take a run complete the ids list
// gives (execids; sweep ids for sweep show, sweeps true) besides their
// flags: every command whose ArgsUsage names an execid or a sweepid.
func CompleteRuns(cmds []*cli.Command, list func(c *cli.Context, sweeps bool) []string) {
	for _, cmd := range cmds {
		CompleteRuns(cmd.Subcommands, list)
		usage := strings.ToLower(cmd.ArgsUsage)
		sweeps := strings.Contains(usage, "sweepid")
		if !sweeps && !strings.Contains(usage, "execid") {
			continue
		}
		flags := cli.DefaultCompleteWithFlags(cmd)
		cmd.BashComplete = func(c *cli.Context) {
			if n := len(os.Args); n > 2 && strings.HasPrefix(os.Args[n-2], "-") {
				flags(c)
				return
			}
			for _, id := range list(c, sweeps) {
				fmt.Fprintln(c.App.Writer, id)
			}
		}
	}
}
