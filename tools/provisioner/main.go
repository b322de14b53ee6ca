// A volume provisioner for the test environment's one node, on the external-provisioner
// pattern (sigs.k8s.io/sig-storage-lib-external-provisioner): it runs on the host next to the
// kubelet and gives each claim of its StorageClass a fresh directory under -root, as a
// hostPath volume. The directory is world-writable because hostPath volumes get no fsGroup
// ownership, and topk's pods run as a non-root user. Delete removes the directory.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
	"sigs.k8s.io/sig-storage-lib-external-provisioner/v13/controller"
)

type hostDirs struct{ root string }

func (h hostDirs) Provision(_ context.Context, opts controller.ProvisionOptions) (*v1.PersistentVolume, controller.ProvisioningState, error) {
	dir := filepath.Join(h.root, opts.PVName)
	if err := os.MkdirAll(dir, 0o777); err != nil {
		return nil, controller.ProvisioningFinished, fmt.Errorf("creating %s: %w", dir, err)
	}
	// MkdirAll's mode is filtered by the umask.
	if err := os.Chmod(dir, 0o777); err != nil {
		return nil, controller.ProvisioningFinished, fmt.Errorf("chmod %s: %w", dir, err)
	}
	reclaim := v1.PersistentVolumeReclaimDelete
	if opts.StorageClass.ReclaimPolicy != nil {
		reclaim = *opts.StorageClass.ReclaimPolicy
	}
	hostPathType := v1.HostPathDirectory
	pv := &v1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: opts.PVName},
		Spec: v1.PersistentVolumeSpec{
			PersistentVolumeReclaimPolicy: reclaim,
			AccessModes:                   opts.PVC.Spec.AccessModes,
			Capacity:                      v1.ResourceList{v1.ResourceStorage: opts.PVC.Spec.Resources.Requests[v1.ResourceStorage]},
			PersistentVolumeSource: v1.PersistentVolumeSource{
				HostPath: &v1.HostPathVolumeSource{Path: dir, Type: &hostPathType},
			},
		},
	}
	klog.Infof("provisioned %s for %s/%s at %s", opts.PVName, opts.PVC.Namespace, opts.PVC.Name, dir)
	return pv, controller.ProvisioningFinished, nil
}

func (h hostDirs) Delete(_ context.Context, pv *v1.PersistentVolume) error {
	if pv.Spec.HostPath == nil {
		return &controller.IgnoredError{Reason: "not a hostPath volume"}
	}
	dir := pv.Spec.HostPath.Path
	if filepath.Dir(dir) != filepath.Clean(h.root) {
		return &controller.IgnoredError{Reason: fmt.Sprintf("%s is not under %s", dir, h.root)}
	}
	klog.Infof("deleting %s (%s)", pv.Name, dir)
	return os.RemoveAll(dir)
}

func main() {
	kubeconfig := flag.String("kubeconfig", "", "kubeconfig of the cluster")
	name := flag.String("name", "topk.io/testenv-hostpath", "provisioner name, as the StorageClass names it")
	root := flag.String("root", "", "directory the volumes are made in")
	klog.InitFlags(nil)
	flag.Parse()
	if *root == "" {
		klog.Fatal("-root is required")
	}
	config, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		klog.Fatalf("kubeconfig: %v", err)
	}
	client, err := kubernetes.NewForConfig(config)
	if err != nil {
		klog.Fatalf("client: %v", err)
	}
	if err := os.MkdirAll(*root, 0o755); err != nil {
		klog.Fatalf("creating %s: %v", *root, err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	controller.NewProvisionController(ctx, client, *name, hostDirs{root: *root},
		controller.LeaderElection(false)).Run(ctx)
}
