package driver

import (
	"context"
	"os"

	"go.uber.org/zap"
	"google.golang.org/grpc"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

// registrationServer answers kubelet's plugin watcher: kubelet finds the
// socket in its plugins_registry directory, asks GetInfo for the driver's
// name and CSI endpoint, and reports whether registration worked. It is what
// the node-driver-registrar sidecar serves, built in so that a node can run
// without that sidecar (it cannot be built on every machine).
type registrationServer struct {
	registerapi.UnimplementedRegistrationServer
	driverName string
	endpoint   string // the CSI socket's path as kubelet sees it
	log        *zap.Logger
}

// supportedCSIVersions are the CSI versions kubelet may speak to the plugin;
// kubelet accepts 1.x.
var supportedCSIVersions = []string{"1.0.0"}

func (r *registrationServer) GetInfo(context.Context, *registerapi.InfoRequest) (*registerapi.PluginInfo, error) {
	r.log.Info("kubelet plugin watcher asked for plugin info", zap.String("endpoint", r.endpoint))
	return &registerapi.PluginInfo{
		Type:              registerapi.CSIPlugin,
		Name:              r.driverName,
		Endpoint:          r.endpoint,
		SupportedVersions: supportedCSIVersions,
	}, nil
}

func (r *registrationServer) NotifyRegistrationStatus(_ context.Context, s *registerapi.RegistrationStatus) (*registerapi.RegistrationStatusResponse, error) {
	if s.PluginRegistered {
		r.log.Info("registered with kubelet", zap.String("driver", r.driverName))
	} else {
		// kubelet retries only when the socket is re-created; the plugin
		// keeps serving so that the error stays visible in its log and in
		// CSINode (no driver entry) rather than in a crash loop.
		r.log.Error("kubelet refused the plugin registration", zap.String("driver", r.driverName), zap.String("error", s.Error))
	}
	return &registerapi.RegistrationStatusResponse{}, nil
}

// serveRegistration serves the registration socket until stop is called.
// It must start only once the CSI socket accepts calls: kubelet calls the
// plugin's NodeGetInfo right after registration.
func (d *Driver) serveRegistration(csiSocket string) (stop func(), err error) {
	path := d.opts.RegistrationSocket()
	lis, err := listenUnix(path)
	if err != nil {
		return nil, err
	}
	endpoint := d.opts.KubeletRegistrationPath
	if endpoint == "" {
		endpoint = csiSocket
	}
	srv := grpc.NewServer()
	registerapi.RegisterRegistrationServer(srv, &registrationServer{
		driverName: d.opts.DriverName, endpoint: endpoint, log: d.log,
	})
	go func() { _ = srv.Serve(lis) }()
	d.log.Info("serving kubelet plugin registration", zap.String("socket", path), zap.String("endpoint", endpoint))
	return func() {
		// Removing the socket first makes kubelet deregister the plugin
		// before its CSI socket goes away.
		_ = os.Remove(path)
		srv.Stop()
	}, nil
}
