import { checkK8s, k8sFieldOfMessage, k8sOf, linesOf } from '../src/k8sRequest';
import { INewSession, checkForm, fieldOfMessage, requestOf } from '../src/sessionRequest';

const form = (extra: Partial<INewSession> = {}): INewSession => ({
  name: 'train', launcher: 'k8s', hosts: '', nodes: '2', kind: 'gpus', count: '4', backend: '', ...extra
});

describe('the Kubernetes fields of the new-session form', () => {
  it('post launcher "k8s" and a k8s object with what was filled in', () => {
    expect(requestOf(form())).toEqual({ name: 'train', launcher: 'k8s', nodes: 2, gpus: 4, k8s: {} });
    const full = form({
      hosts: 'left,from,ssh',
      k8sNamespace: ' ml ', k8sContext: 'kind-kind', k8sImage: 'ghcr.io/team/train:1.0',
      k8sCpus: '500m', k8sMemory: '64Gi',
      k8sNodeSelectors: 'nvidia.com/gpu.product=H100\n\n  pool=train  \n',
      k8sTolerations: 'nvidia.com/gpu:NoSchedule\nspot=true:NoExecute',
      k8sPodTemplate: '/srv/pod.yaml', k8sCallback: '10.0.3.7:7077', k8sTimeout: '600'
    });
    expect(requestOf(full)).toEqual({
      name: 'train', launcher: 'k8s', nodes: 2, gpus: 4,
      k8s: {
        namespace: 'ml', context: 'kind-kind', image: 'ghcr.io/team/train:1.0', cpus: '500m',
        memory: '64Gi', node_selector: ['nvidia.com/gpu.product=H100', 'pool=train'],
        tolerations: ['nvidia.com/gpu:NoSchedule', 'spot=true:NoExecute'],
        pod_template: '/srv/pod.yaml', callback: '10.0.3.7:7077', timeout: 600
      }
    });
    // nothing of Kubernetes' for another launcher, whatever its hidden fields hold
    expect(requestOf(form({ launcher: 'local', nodes: '', k8sNamespace: 'ml', k8sCpus: '8' }))).toEqual({
      name: 'train', gpus: 4
    });
    expect(requestOf(form({ launcher: 'ray', k8sMemory: '1Gi' })).k8s).toBeUndefined();
    // a timeout that is not a number goes as typed, for the server to name
    expect(k8sOf({ k8sTimeout: '5m' })).toEqual({ timeout: '5m' });
    expect(linesOf(' a=b \n\n c=d')).toEqual(['a=b', 'c=d']);
  });

  it('are checked in place as the --k8s flags are, naming the value and what is expected', () => {
    expect(checkForm(form())).toEqual({});
    expect(
      checkForm(form({
        k8sNamespace: 'ml-team', k8sContext: 'gke_proj_zone_cluster', k8sImage: 'python:3.11-slim',
        k8sCpus: '0.5', k8sMemory: '512Mi', k8sNodeSelectors: 'kubernetes.io/arch=amd64\ngpu=',
        k8sTolerations: 'nvidia.com/gpu:NoSchedule\nteam=ml:PreferNoSchedule',
        k8sCallback: '[fd00::7]:7077', k8sTimeout: '86400'
      }))
    ).toEqual({});
    const wrong = checkForm(form({
      hosts: 'a,b', k8sNamespace: 'ML_Team', k8sImage: 'my image', k8sCpus: '0', k8sMemory: '64GB',
      k8sNodeSelectors: 'pool=train\ngpu', k8sTolerations: 'nvidia.com/gpu:Never',
      k8sCallback: 'notebook', k8sTimeout: '0'
    }));
    expect(Object.keys(wrong).sort()).toEqual([
      'hosts', 'k8sCallback', 'k8sCpus', 'k8sImage', 'k8sMemory', 'k8sNamespace', 'k8sNodeSelectors',
      'k8sTimeout', 'k8sTolerations'
    ]);
    expect(wrong.hosts).toContain('leave Hosts empty');
    expect(wrong.k8sNamespace).toContain("'ML_Team': expected a Kubernetes namespace");
    expect(wrong.k8sImage).toContain("'my image': expected an image reference");
    expect(wrong.k8sCpus).toContain("'0': expected a Kubernetes quantity more than 0");
    expect(wrong.k8sMemory).toContain("'64GB': expected a Kubernetes quantity more than 0, such as 64Gi");
    expect(wrong.k8sNodeSelectors).toContain("'gpu': expected key=value");
    expect(wrong.k8sTolerations).toContain("'nvidia.com/gpu:Never': expected key[=value]:Effect");
    expect(wrong.k8sCallback).toContain("'notebook': expected HOST:PORT");
    expect(wrong.k8sTimeout).toContain("'0': expected seconds, more than 0, at most 86400");
    expect(checkK8s({ k8sCallback: 'a:70000' }).k8sCallback).toContain("'a:70000'");
    expect(checkK8s({ k8sNodeSelectors: '-x=y' }).k8sNodeSelectors).toContain("label key '-x'");
    expect(checkK8s({ k8sTolerations: 'a=b c:NoSchedule' }).k8sTolerations).toContain("value 'b c'");
    expect(checkK8s({ k8sNodeSelectors: 'a=b\n'.repeat(65) }).k8sNodeSelectors).toContain(
      '65 lines: expected at most 64'
    );
    // Kubernetes' checks are for the Kubernetes launcher only
    expect(checkForm(form({ launcher: 'local', nodes: '', k8sNamespace: 'ML_Team' }))).toEqual({});
  });

  it("put the server's messages about the k8s object at their field", () => {
    expect(fieldOfMessage("k8s: --namespace 'ML': expected a Kubernetes namespace")).toBe('k8sNamespace');
    expect(fieldOfMessage("k8s: --memory '1x': expected a Kubernetes quantity")).toBe('k8sMemory');
    expect(fieldOfMessage("k8s: --pod-template '/srv/p.yaml': No such file or directory")).toBe('k8sPodTemplate');
    expect(fieldOfMessage("k8s: --node-selector 'gpu': expected key=value")).toBe('k8sNodeSelectors');
    expect(fieldOfMessage("k8s: --toleration 'a:B': expected key[=value]:Effect")).toBe('k8sTolerations');
    expect(fieldOfMessage("k8s: --k8s-callback 'x': expected HOST:PORT")).toBe('k8sCallback');
    expect(fieldOfMessage('k8s: --k8s-timeout 0: expected seconds')).toBe('k8sTimeout');
    expect(fieldOfMessage("k8s.cpus: '8' is not a str")).toBe('k8sCpus');
    expect(fieldOfMessage("k8s: unknown field 'x'; expected callback, ...")).toBe('launcher');
    expect(fieldOfMessage('k8s options without --k8s: add --k8s')).toBe('launcher');
    expect(fieldOfMessage('--k8s and --hosts/--hostfile: give one')).toBe('launcher');
    expect(k8sFieldOfMessage('ray: --ray-cpus 0: expected 1 to 4096')).toBeNull();
    expect(fieldOfMessage('ray: --ray-cpus 0: expected 1 to 4096')).toBe('rayCpus');
  });

  it('take a Kueue queue and a GPU resource by name, checked as the flags are', () => {
    expect(k8sOf({ k8sQueue: ' team-gpus ', k8sGpuResource: 'nvidia.com/mig-1g.10gb' })).toEqual({
      queue: 'team-gpus', gpu_resource: 'nvidia.com/mig-1g.10gb'
    });
    expect(checkK8s({ k8sQueue: 'team-gpus', k8sGpuResource: 'amd.com/gpu' })).toEqual({});
    const wrong = checkK8s({ k8sQueue: 'Team_GPUs', k8sGpuResource: 'gpu' });
    expect(wrong.k8sQueue).toContain("'Team_GPUs': expected the name of a Kueue LocalQueue");
    expect(wrong.k8sGpuResource).toContain("'gpu': expected an extended resource name DOMAIN/NAME");
    for (const bad of ['kubernetes.io/gpu', 'nvidia/gpu', 'nvidia.com/', `nvidia.com/${'g'.repeat(55)}`]) {
      expect(checkK8s({ k8sGpuResource: bad }).k8sGpuResource).toContain('expected an extended resource');
    }
    expect(fieldOfMessage("k8s: --k8s-queue 'Q': expected the name of a Kueue LocalQueue")).toBe('k8sQueue');
    expect(fieldOfMessage("k8s.gpu_resource: '7' is not a str")).toBe('k8sGpuResource');
  });
});
