package main

import (
	"fmt"
	"os"
	"strings"

	"github.com/hpcrun/hpcrun/internal/rundir"

	"github.com/urfave/cli/v2"
)

const bashCompletion = `# bash completion for hpcrun; source it or put it in /etc/bash_completion.d
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

const zshCompletion = `#compdef hpcrun
_hpcrun() {
	local -a opts
	local n=$((CURRENT-2))
	[[ "${words[CURRENT]}" == -* ]] && n=$((CURRENT-1))
	opts=("${(@f)$(${words[1]} ${words[@]:1:$n} --generate-bash-completion 2>/dev/null)}")
	_describe 'values' opts
}
compdef _hpcrun hpcrun
`

func completionCommand() *cli.Command {
	return &cli.Command{
		Name:      "completion",
		Usage:     "print a shell completion script (bash or zsh)",
		ArgsUsage: "bash|zsh",
		Action: func(c *cli.Context) error {
			switch shell := c.Args().First(); shell {
			case "", "bash":
				fmt.Fprint(c.App.Writer, bashCompletion)
			case "zsh":
				fmt.Fprint(c.App.Writer, zshCompletion)
			default:
				return cli.Exit(fmt.Sprintf("completion: unknown shell %q; use bash or zsh", shell), 2)
			}
			return nil
		},
	}
}

// completeRuns makes the commands that take a run complete execids (and
// sweep show sweep ids) besides their flags: every command whose ArgsUsage
// names an execid or a sweepid.
func completeRuns(cmds []*cli.Command) {
	for _, cmd := range cmds {
		completeRuns(cmd.Subcommands)
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
			runs, err := runsDir(c)
			if err != nil {
				return
			}
			if sweeps {
				runs = rundir.Sweeps(runs)
			}
			all, _ := rundir.List(runs)
			for _, r := range all {
				fmt.Fprintln(c.App.Writer, r.ExecID)
			}
		}
	}
}
