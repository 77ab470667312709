package main

import (
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"k8s.io/cli-runtime/pkg/genericclioptions"
)

const rootLong = `kubectl spindle: Spindle volumes from claim to device.

It uses the kubeconfig and flags as kubectl does, and reaches the driver's
node plugins and controller through the API server's pod proxy: it needs
"get" on pods/proxy in the driver's namespace, besides reading (get, list)
PVs, PVCs, VolumeAttachments, Nodes, CSINodes, Pods and Events.
It only reads, except rotate-key, which needs "create" on pods/proxy and
"get" on the Secret the volume's PV names for NodeStageVolume, and adopt
(see kubectl spindle adopt --help).`

// errNoCommand: `kubectl spindle` alone prints the help and fails, as a
// script that forgot the command should.
var errNoCommand = errors.New("no command given")

// command carries what every subcommand needs.
type command struct {
	o           options
	stdout      io.Writer
	makeClients func(options) (*clients, error)
	code        *int
}

// newRootCommand builds the command tree; the subcommands set *code.
func newRootCommand(stdout, stderr io.Writer, makeClients func(options) (*clients, error), code *int) *cobra.Command {
	c := &command{stdout: stdout, makeClients: makeClients, code: code}
	c.o.config = genericclioptions.NewConfigFlags(true)
	root := &cobra.Command{
		Use:   "kubectl-spindle",
		Short: "Spindle volumes from claim to device",
		Long:  rootLong,
		// kubectl runs the plugin as `kubectl spindle`; help says so.
		Annotations:       map[string]string{cobra.CommandDisplayNameAnnotation: "kubectl spindle"},
		SilenceUsage:      true,
		SilenceErrors:     true,
		PersistentPreRunE: func(*cobra.Command, []string) error { return c.checkOutput() },
		RunE: func(cmd *cobra.Command, _ []string) error {
			_ = cmd.Help()
			return errNoCommand
		},
	}
	root.SetOut(stdout)
	root.SetErr(stderr)
	flags := root.PersistentFlags()
	c.o.config.AddFlags(flags)
	// -n means more here than kubectl's wording says.
	flags.Lookup("namespace").Usage = "namespace of the claim describe looks up (default: the context's); volumes shows only claims of it (default: all)"
	flags.StringVarP(&c.o.output, "output", "o", "table", "output format: table, json or yaml")
	flags.StringVar(&c.o.driver, "driver", defaultDriver, "the CSI driver name")
	// Every command takes these, as before the plugin had subcommands, so
	// that scripts may give the same flags to each.
	c.addReachFlags(flags)
	flags.StringVar(&c.o.controllerURL, "controller-url", "", "doctor, adopt and rotate-key: the controller's metrics address (http://HOST:PORT), reached directly instead of through the API server")
	flags.DurationVar(&c.o.stuckAfter, "stuck-after", 5*time.Minute, "doctor: how old an attach or detach error, or an unfinished detach, must be to count as stuck")
	root.AddCommand(c.volumesCommand(), c.describeCommand(), c.doctorCommand(), c.rotateKeyCommand(), c.adoptCommand())
	return root
}

func (c *command) checkOutput() error {
	switch c.o.output {
	case "table", "json", "yaml":
		return nil
	}
	return fmt.Errorf("-o %q: must be table, json or yaml", c.o.output)
}

// addReachFlags say how describe and doctor reach the driver's pods.
func (c *command) addReachFlags(fs *pflag.FlagSet) {
	fs.StringVar(&c.o.driverNamespace, "driver-namespace", "", "namespace of the driver's pods (the chart's release); default: found in any namespace")
	fs.StringVar(&c.o.podSelector, "pod-selector", DefaultPodSelector, "label selector of the chart's pods; app.kubernetes.io/component=node|controller is added")
	fs.IntVar(&c.o.nodePort, "node-port", 9838, "port of a node plugin's endpoints when its pod declares no port named metrics and no --metrics-address")
	fs.IntVar(&c.o.controllerPort, "controller-port", 9810, "port of the controller's endpoints when its pod declares no port named metrics and no --metrics-address")
	fs.StringArrayVar(&c.o.nodeAddresses, "node-address", nil, "NODE=HOST:PORT (or URL) of a node plugin's metrics address, read directly instead of through the API server; repeatable (the Node annotation "+NodeAddressAnnotation+" does the same)")
}

// report writes result in the -o format and sets the exit code.
func (c *command) report(result any, table func(io.Writer), code int) error {
	if err := write(c.stdout, c.o.output, result, table); err != nil {
		return err
	}
	*c.code = code
	return nil
}

func (c *command) volumesCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "volumes",
		Aliases: []string{"volume", "vol"},
		Short:   "every PV of the driver, its attachments per node",
		Args:    noArgs("volumes"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			cl, err := c.makeClients(c.o)
			if err != nil {
				return err
			}
			vols, err := Volumes(cmd.Context(), cl.kube, c.o.driver, c.o.namespaceFlag())
			if err != nil {
				return err
			}
			return c.report(vols, func(w io.Writer) { _ = printVolumesTable(w, vols, cl.now) }, exitOK)
		},
	}
	cmd.Flags().BoolVarP(&c.o.allNamespaces, "all-namespaces", "A", false, "volumes of claims in every namespace (the default without -n)")
	return cmd
}

func (c *command) describeCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "describe PVC|pvc/NAME|pv/NAME|VOLUME-ID",
		Short: "the chain PVC -> PV -> attachments -> node device and staging path -> pods, with events",
		Long: `describe takes a claim in the namespace (-n), pvc/NAME, pv/NAME or a volume
handle (loop/default/pvc-...), and follows it to the device, the staging
path and the mount on each node, as that node's plugin reports them.`,
		Args:              oneArgument("describe takes one PVC, PV or volume ID"),
		ValidArgsFunction: c.completeVolume,
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := c.makeClients(c.o)
			if err != nil {
				return err
			}
			d, err := Describe(cmd.Context(), cl.kube, c.o.driver, cl.namespace, args[0], cl.nodes, cl.controller)
			if err != nil {
				return err
			}
			return c.report(d, func(w io.Writer) { printDescription(w, d, cl.now) }, exitOK)
		},
	}
	return cmd
}

func (c *command) rotateKeyCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "rotate-key PVC|pvc/NAME|pv/NAME|VOLUME-ID",
		Short: "give an encrypted volume a new key while it is in use",
		Long: `rotate-key replaces the passphrase of an encrypted volume (StorageClass
parameter encrypted: "true") while pods use it: the controller makes a new
random passphrase and has the volume's KMS wrap it, the node that stages the
volume adds it to a free LUKS keyslot, proves it opens the volume, and
destroys the old keyslot; the controller then records the new key. The data
and the volume key do not change, so nothing is unmounted. A rotation that
stopped part-way is finished by running rotate-key again.`,
		Args:              oneArgument("rotate-key takes one PVC, PV or volume ID"),
		ValidArgsFunction: c.completeVolume,
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := c.makeClients(c.o)
			if err != nil {
				return err
			}
			if cl.rotator == nil {
				return errors.New("rotate-key cannot reach the driver's endpoints")
			}
			r, err := RotateKey(cmd.Context(), cl.kube, c.o.driver, cl.namespace, args[0], cl.rotator)
			if err != nil {
				return err
			}
			return c.report(r, func(w io.Writer) { printRotated(w, r) }, exitOK)
		},
	}
}

func (c *command) adoptCommand() *cobra.Command {
	o := AdoptOptions{}
	cmd := &cobra.Command{
		Use:   "adopt pvc/NAME",
		Short: "move a claim of ceph-csi's RBD driver onto Spindle in place, copying nothing",
		Long: `adopt moves a bound claim (in the namespace, -n) whose PV belongs to ceph-csi's
RBD driver (rbd.csi.ceph.com, rook-ceph.rbd.csi.ceph.com, ...) onto Spindle,
copying no data: the Deployments, StatefulSets and ReplicaSets whose pods use
it are scaled to zero, the PV is kept (reclaim policy Retain), the controller
gives the image Spindle's records, a Spindle PV of the same image and a claim
of the same name are bound, and the workloads are scaled back. The pods are
down from the scale-down until they start again on the new claim.

The claim gets --storage-class, a StorageClass of Spindle's (default: the one
whose clusterID and pool are the PV's). --dry-run checks everything (the
controller included) and prints every step without changing anything. An
adoption that stopped part-way is finished by running adopt again.

It needs, besides what the other commands read: patch on persistentvolumes,
deployments, statefulsets and replicasets; create and delete on
persistentvolumes and persistentvolumeclaims; get on the Secret the
StorageClass names for the provisioner (or --secret); and create on
pods/proxy in the driver's namespace.`,
		Args: oneArgument("adopt takes one claim: pvc/NAME"),
		ValidArgsFunction: func(*cobra.Command, []string, string) ([]cobra.Completion, cobra.ShellCompDirective) {
			return nil, cobra.ShellCompDirectiveNoFileComp
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := c.makeClients(c.o)
			if err != nil {
				return err
			}
			if cl.adopter == nil {
				return errNoAdopter
			}
			o.Driver = c.o.driver
			if c.o.output == "table" {
				o.Log = c.stdout
			}
			a, err := Adopt(cmd.Context(), cl.kube, cl.namespace, args[0], cl.adopter, o)
			if err != nil {
				return err
			}
			return c.report(a, func(w io.Writer) { printAdoption(w, a) }, exitOK)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.StorageClass, "storage-class", "", "the Spindle StorageClass the claim gets (default: the one whose clusterID and pool are the PV's)")
	f.StringVar(&o.Secret, "secret", "", "NAMESPACE/NAME of the Secret with the cephx credentials for the controller (default: the StorageClass's provisioner secret)")
	f.BoolVar(&o.DryRun, "dry-run", false, "check everything and print every step; change nothing")
	f.DurationVar(&o.Timeout, "timeout", 5*time.Minute, "how long each wait may take (pods gone, claim deleted, claim bound)")
	return cmd
}

func (c *command) doctorCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "doctor",
		Short: "stuck attachments, missing images, leaked devices and mounts, each with the command that fixes it",
		Long: `doctor changes nothing: each finding comes with the command that would fix
it, for you to run. It exits 1 when it found problems, 2 when it could not
look.`,
		Args: noArgs("doctor"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			cl, err := c.makeClients(c.o)
			if err != nil {
				return err
			}
			findings, err := Doctor(cmd.Context(), cl.kube, DoctorOptions{
				Driver: c.o.driver, StuckAfter: c.o.stuckAfter, Now: cl.now, Nodes: cl.nodes, Controller: cl.controller,
			})
			if err != nil {
				return err
			}
			if findings == nil {
				findings = []Finding{}
			}
			if cl.controller == nil && c.o.output == "table" {
				fmt.Fprintln(cmd.ErrOrStderr(), "note: the controller was not asked; PVs were not checked for missing images")
			}
			code := exitOK
			if len(findings) > 0 {
				code = exitFindings
			}
			return c.report(findings, func(w io.Writer) { printFindings(w, findings) }, code)
		},
	}
	return cmd
}

// noArgs refuses arguments, naming the command.
func noArgs(name string) cobra.PositionalArgs {
	return func(_ *cobra.Command, args []string) error {
		if len(args) != 0 {
			return fmt.Errorf("%s takes no arguments", name)
		}
		return nil
	}
}

// completeVolume completes describe's argument: the claims of the
// namespace and pv/NAME of the driver's PVs.
func (c *command) completeVolume(cmd *cobra.Command, args []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
	if len(args) != 0 {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	cl, err := c.makeClients(c.o)
	if err != nil {
		return nil, cobra.ShellCompDirectiveError
	}
	inv, err := readInventory(cmd.Context(), cl.kube, c.o.driver)
	if err != nil {
		return nil, cobra.ShellCompDirectiveError
	}
	var out []cobra.Completion
	for _, pv := range inv.pvs {
		if ref := pv.Spec.ClaimRef; ref != nil && ref.Namespace == cl.namespace {
			out = append(out, ref.Name)
		}
		out = append(out, "pv/"+pv.Name)
	}
	var matching []cobra.Completion
	for _, s := range out {
		if strings.HasPrefix(s, toComplete) {
			matching = append(matching, s)
		}
	}
	return matching, cobra.ShellCompDirectiveNoFileComp
}

// oneArgument is a cobra Args check for the commands that name one volume:
// anything but one argument is refused with message.
func oneArgument(message string) cobra.PositionalArgs {
	return func(_ *cobra.Command, args []string) error {
		if len(args) != 1 {
			return errors.New(message)
		}
		return nil
	}
}
